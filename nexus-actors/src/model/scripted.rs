//! The scripted provider: deterministic, stateless answers read from a JSON script.
//!
//! Used by tests and by `nexus quickstart`; it does no I/O.
//!
//! # Script format
//!
//! ```json
//! {"rounds": [
//!   {"tool_calls": [{"id": "count", "name": "bash", "arguments": {"command": "wc -l *.rs"}}]},
//!   {"final": "There are {{tool:count.stdout}} lines; you asked: {{input}}"}
//! ]}
//! ```
//!
//! - `rounds`: a non-empty array. Each round has exactly one of:
//!   - `tool_calls`: a non-empty array of `{id?, name, arguments?}`. `id` defaults to
//!     `call_{round}_{index}` (both 0-based), must be non-empty, unique within the round and free
//!     of `.`, `{` and `}`. `name` is emitted as written, even when the request offers no such
//!     tool (the server then answers `unknown_tool`). `arguments` is any JSON value, sent as its
//!     JSON text; a JSON string is sent verbatim (so a script can send malformed arguments);
//!     absent means `{}`. The answer's finish reason is `tool_calls`, or the round's optional
//!     `finish_reason` (e.g. `length`, to play arguments cut off at the output limit).
//!   - `final`: the answer text, with placeholders expanded. The finish reason is `stop`.
//! - Unknown fields are refused.
//!
//! # Which round answers
//!
//! The round index is the number of assistant messages in the request's transcript after the
//! last user message (all of them when there is none). So each new user input restarts the
//! script at round 0, and every tool round the model completed moves it on by one. A transcript
//! that needs a round the script does not have is `provider_error` with the message
//! `script exhausted at round N` (N 0-based).
//!
//! # Placeholders (in `final` only)
//!
//! - `{{input}}`: the content of the last user message (empty when there is none).
//! - `{{tool:ID}}`: the content of the last tool message whose `tool_call_id` is `ID`, trimmed.
//! - `{{tool:ID.FIELD}}`: one field of that tool result, trimmed. If the content is a JSON object,
//!   the field's value (a string as is, anything else as JSON text). Otherwise the content is read
//!   as text sections, as in the runner's bash result
//!   `exit_code: N\nstdout:\n<stdout>\nstderr:\n<stderr>`: a line `FIELD: value` gives `value`;
//!   a line `FIELD:` alone starts a block that runs until the next section header (a line
//!   consisting only of a section name and a colon, `stderr:`, or of `name: (empty)`), or the
//!   end. So a stdout line that is exactly `word:` would end the stdout block early.
//!
//! A `{{…}}` that is none of these is refused when the script is parsed; `{{` without a closing
//! `}}` is literal text. A missing tool result is `provider_error` at answer time; a result without
//! the field (a failed, denied or timed-out call's text) is read whole. A rendered text longer than
//! [`RENDER_BOUND`] (1 MiB) is `provider_error` too, found before it is built.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use serde::Deserialize;

use super::{
    BoxFuture, ChatMessage, ModelError, ModelProvider, ModelRequest, ModelResponse, ToolCall, TranscriptDelta,
};

/// Why a script was refused.
#[non_exhaustive]
#[derive(thiserror::Error, Debug)]
pub enum ScriptError {
    /// The text is not JSON of the script shape (including unknown fields).
    #[error("script is not valid script JSON: {0}")]
    Json(#[from] serde_json::Error),
    /// `rounds` is empty.
    #[error("script has no rounds")]
    NoRounds,
    /// One round breaks a rule of the format.
    #[error("script round {round}: {reason}")]
    Round {
        /// The 0-based round index.
        round: usize,
        /// Which rule.
        reason: String,
    },
}

/// A parsed, validated script (format in the module docs).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Script {
    rounds: Vec<Round>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Round {
    /// The calls and the finish reason (`tool_calls` unless the script names another).
    ToolCalls(Vec<ToolCall>, String),
    Final(Vec<Segment>),
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Segment {
    Text(String),
    Input,
    Tool { id: String, field: Option<String> },
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ScriptFile {
    rounds: Vec<RoundFile>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RoundFile {
    #[serde(default)]
    tool_calls: Option<Vec<ToolCallFile>>,
    #[serde(default, rename = "final")]
    final_text: Option<String>,
    #[serde(default)]
    finish_reason: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ToolCallFile {
    #[serde(default)]
    id: Option<String>,
    name: String,
    #[serde(default)]
    arguments: Option<serde_json::Value>,
}

impl Script {
    /// Parses and validates a script; see the module docs for the format and the rules.
    pub fn from_json(text: &str) -> Result<Self, ScriptError> {
        let file: ScriptFile = serde_json::from_str(text)?;
        if file.rounds.is_empty() {
            return Err(ScriptError::NoRounds);
        }
        let rounds = file
            .rounds
            .into_iter()
            .enumerate()
            .map(|(index, round)| parse_round(index, round))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self { rounds })
    }

    /// The number of rounds.
    #[must_use]
    pub fn len(&self) -> usize {
        self.rounds.len()
    }

    /// Always `false`: a parsed script has at least one round.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.rounds.is_empty()
    }

    /// Answers a transcript: picks the round (module docs, "Which round answers") and renders it.
    /// Errors are [`ModelError::Provider`] (`provider_error`).
    pub fn respond(&self, messages: &[ChatMessage]) -> Result<ModelResponse, ModelError> {
        let round_index = round_index(messages);
        let Some(round) = self.rounds.get(round_index) else {
            return Err(ModelError::Provider { message: format!("script exhausted at round {round_index}") });
        };
        match round {
            Round::ToolCalls(calls, finish_reason) => Ok(ModelResponse {
                text: None,
                tool_calls: calls.clone(),
                finish_reason: finish_reason.clone(),
                usage: None,
            }),
            Round::Final(segments) => Ok(ModelResponse {
                text: Some(render(segments, messages, round_index)?),
                tool_calls: Vec::new(),
                finish_reason: "stop".to_owned(),
                usage: None,
            }),
        }
    }
}

fn parse_round(index: usize, round: RoundFile) -> Result<Round, ScriptError> {
    let invalid = |reason: String| ScriptError::Round { round: index, reason };
    match (round.tool_calls, round.final_text) {
        (None, _) if round.finish_reason.is_some() => {
            Err(invalid("`finish_reason` is only for a `tool_calls` round".to_owned()))
        }
        (Some(calls), None) => {
            if calls.is_empty() {
                return Err(invalid("`tool_calls` is empty".to_owned()));
            }
            let mut seen = BTreeSet::new();
            let mut out = Vec::with_capacity(calls.len());
            for (position, call) in calls.into_iter().enumerate() {
                let id = call.id.unwrap_or_else(|| format!("call_{index}_{position}"));
                if id.is_empty() || id.contains(['.', '{', '}']) {
                    return Err(invalid(format!("tool call id `{id}` must be non-empty without `.`, `{{` or `}}`")));
                }
                if !seen.insert(id.clone()) {
                    return Err(invalid(format!("tool call id `{id}` is repeated")));
                }
                if call.name.is_empty() {
                    return Err(invalid(format!("tool call `{id}` has an empty name")));
                }
                let arguments = match call.arguments {
                    None => "{}".to_owned(),
                    Some(serde_json::Value::String(raw)) => raw,
                    Some(value) => value.to_string(),
                };
                out.push(ToolCall { id, name: call.name, arguments, model_id: None });
            }
            Ok(Round::ToolCalls(out, round.finish_reason.unwrap_or_else(|| "tool_calls".to_owned())))
        }
        (None, Some(text)) => parse_template(&text).map(Round::Final).map_err(invalid),
        (Some(_), Some(_)) => Err(invalid("has both `tool_calls` and `final`".to_owned())),
        (None, None) => Err(invalid("needs `tool_calls` or `final`".to_owned())),
    }
}

fn parse_template(text: &str) -> Result<Vec<Segment>, String> {
    let mut segments = Vec::new();
    let mut rest = text;
    while let Some(open) = rest.find("{{") {
        let after_open = &rest[open + 2..];
        let Some(close) = after_open.find("}}") else {
            break;
        };
        if open > 0 {
            segments.push(Segment::Text(rest[..open].to_owned()));
        }
        segments.push(parse_placeholder(&after_open[..close])?);
        rest = &after_open[close + 2..];
    }
    if !rest.is_empty() {
        segments.push(Segment::Text(rest.to_owned()));
    }
    Ok(segments)
}

fn parse_placeholder(inner: &str) -> Result<Segment, String> {
    let name = inner.trim();
    if name == "input" {
        return Ok(Segment::Input);
    }
    let unknown = || format!("unknown placeholder `{{{{{inner}}}}}` (expected input, tool:ID or tool:ID.FIELD)");
    let Some(target) = name.strip_prefix("tool:") else {
        return Err(unknown());
    };
    let (id, field) = match target.split_once('.') {
        Some((id, field)) => (id, Some(field)),
        None => (target, None),
    };
    if id.is_empty() || field.is_some_and(str::is_empty) {
        return Err(unknown());
    }
    Ok(Segment::Tool { id: id.to_owned(), field: field.map(str::to_owned) })
}

/// Assistant messages after the last user message.
fn round_index(messages: &[ChatMessage]) -> usize {
    let start = messages
        .iter()
        .rposition(|message| matches!(message, ChatMessage::User { .. }))
        .map_or(0, |position| position + 1);
    messages[start..].iter().filter(|message| matches!(message, ChatMessage::Assistant { .. })).count()
}

fn last_input(messages: &[ChatMessage]) -> &str {
    messages
        .iter()
        .rev()
        .find_map(|message| match message {
            ChatMessage::User { content } => Some(content.as_str()),
            _ => None,
        })
        .unwrap_or("")
}

/// The longest text a `final` round renders, in bytes (1 MiB): placeholders repeat transcript
/// text, so a short script could otherwise multiply a long input into gigabytes.
pub const RENDER_BOUND: usize = 1 << 20;

/// Appends `piece` to the rendered text, or refuses once the text would pass [`RENDER_BOUND`].
fn push_bounded(out: &mut String, piece: &str, round_index: usize) -> Result<(), ModelError> {
    if out.len() + piece.len() > RENDER_BOUND {
        return Err(ModelError::Provider {
            message: format!(
                "script round {round_index} renders more than {RENDER_BOUND} bytes; use fewer placeholders in its final text"
            ),
        });
    }
    out.push_str(piece);
    Ok(())
}

fn render(segments: &[Segment], messages: &[ChatMessage], round_index: usize) -> Result<String, ModelError> {
    let mut out = String::new();
    let out = &mut out;
    for segment in segments {
        match segment {
            Segment::Text(text) => push_bounded(out, text, round_index)?,
            Segment::Input => push_bounded(out, last_input(messages), round_index)?,
            Segment::Tool { id, field } => {
                let content = messages
                    .iter()
                    .rev()
                    .find_map(|message| match message {
                        ChatMessage::Tool { tool_call_id, content } if tool_call_id == id => Some(content.as_str()),
                        _ => None,
                    })
                    .ok_or_else(|| ModelError::Provider {
                        message: format!(
                            "script round {round_index}: no tool result with tool_call_id `{id}` in the transcript"
                        ),
                    })?;
                match field {
                    None => push_bounded(out, content.trim(), round_index)?,
                    // A result without the field (a failure, a denial, a timeout) is read whole, as
                    // a model would read it.
                    Some(field) => match tool_field(content, field) {
                        Some(value) => push_bounded(out, value.trim(), round_index)?,
                        None => push_bounded(out, content.trim(), round_index)?,
                    },
                }
            }
        }
    }
    Ok(std::mem::take(out))
}

/// One field of a tool result: from a JSON object, else from `name: value` / `name:\n<block>`
/// text sections (module docs).
fn tool_field(content: &str, field: &str) -> Option<String> {
    if let Ok(serde_json::Value::Object(object)) = serde_json::from_str::<serde_json::Value>(content) {
        return object.get(field).map(|value| match value {
            serde_json::Value::String(text) => text.clone(),
            other => other.to_string(),
        });
    }
    let lines: Vec<&str> = content.split('\n').map(|line| line.strip_suffix('\r').unwrap_or(line)).collect();
    let (header, rest) = lines.iter().enumerate().find_map(|(index, line)| {
        let rest = line.strip_prefix(field)?.strip_prefix(':')?;
        (rest.is_empty() || rest.starts_with(' ')).then_some((index, rest))
    })?;
    let inline = rest.trim();
    if !inline.is_empty() {
        return Some(inline.to_owned());
    }
    let block = &lines[header + 1..];
    let end = block.iter().position(|line| is_bare_header(line)).unwrap_or(block.len());
    Some(block[..end].join("\n"))
}

/// A section header: `name:` alone on its line, or `name: (empty)` (how the runner's bash result
/// shows an empty stream), `name` being `[A-Za-z_][A-Za-z0-9_]*`.
fn is_bare_header(line: &str) -> bool {
    let line = line.trim_end();
    let line = line.strip_suffix(" (empty)").unwrap_or(line);
    let Some(name) = line.strip_suffix(':') else {
        return false;
    };
    let mut chars = name.chars();
    chars.next().is_some_and(|first| first.is_ascii_alphabetic() || first == '_')
        && chars.all(|rest| rest.is_ascii_alphanumeric() || rest == '_')
}

/// The client of one `scripted` provider: model name -> script.
#[derive(Clone, Debug)]
pub struct ScriptedProvider {
    provider: String,
    scripts: BTreeMap<String, Arc<Script>>,
}

impl ScriptedProvider {
    /// A provider named `provider` (used in the no-script answer) with the given scripts.
    #[must_use]
    pub fn new(provider: impl Into<String>, scripts: BTreeMap<String, Arc<Script>>) -> Self {
        Self { provider: provider.into(), scripts }
    }

    fn answer(&self, request: &ModelRequest) -> Result<ModelResponse, ModelError> {
        match self.scripts.get(&request.model) {
            Some(script) => script.respond(&request.messages),
            None => Ok(ModelResponse {
                text: Some(format!(
                    "{}/{} has no script; input was: {}",
                    self.provider,
                    request.model,
                    last_input(&request.messages)
                )),
                tool_calls: Vec::new(),
                finish_reason: "stop".to_owned(),
                usage: None,
            }),
        }
    }
}

impl ModelProvider for ScriptedProvider {
    /// Answers from the script of `request.model`; a model without a script answers
    /// `<provider>/<model> has no script; input was: <input>`. Ready immediately. With a delta
    /// sink, the answer is also reported whole: one `text_delta`, then per call a
    /// `tool_call_started` and one `tool_call_arguments_delta`.
    fn complete<'a>(&'a self, request: ModelRequest) -> BoxFuture<'a, Result<ModelResponse, ModelError>> {
        let answer = self.answer(&request);
        if let (Some(sink), Ok(response)) = (&request.deltas, &answer) {
            if let Some(text) = response.text.as_ref().filter(|text| !text.is_empty()) {
                sink.send(TranscriptDelta::Text { text: text.clone() });
            }
            for (index, call) in response.tool_calls.iter().enumerate() {
                sink.send(TranscriptDelta::ToolCallStarted {
                    index,
                    tool_call_id: call.id.clone(),
                    name: call.name.clone(),
                });
                if !call.arguments.is_empty() {
                    sink.send(TranscriptDelta::ToolCallArguments { index, delta: call.arguments.clone() });
                }
            }
        }
        Box::pin(std::future::ready(answer))
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_result_without_the_field_is_read_whole() {
        let script = Script::from_json(
            r#"{"rounds": [{"tool_calls": [{"id": "count", "name": "bash"}]}, {"final": "got {{tool:count.stdout}}"}]}"#,
        )
        .expect("script");
        let denied =
            "<tool_use_error>This tool call was declined by the approver (approval_denied) no</tool_use_error>";
        let messages = vec![
            ChatMessage::User { content: "go".into() },
            ChatMessage::Assistant {
                content: None,
                tool_calls: vec![ToolCall {
                    id: "count".into(),
                    name: "bash".into(),
                    arguments: "{}".into(),
                    model_id: None,
                }],
            },
            ChatMessage::Tool { tool_call_id: "count".into(), content: denied.into() },
        ];
        let answer = script.respond(&messages).expect("answered");
        assert_eq!(answer.text.as_deref(), Some(format!("got {denied}").as_str()));
    }

    use serde_json::json;

    use super::*;

    const QUICKSTART: &str = include_str!("../../../deploy/quickstart/script.json");

    fn user(text: &str) -> ChatMessage {
        ChatMessage::User { content: text.to_owned() }
    }

    fn provider_with(model: &str, script: &str) -> ScriptedProvider {
        let script = Script::from_json(script).expect("script parses");
        ScriptedProvider::new("scripted", BTreeMap::from([(model.to_owned(), Arc::new(script))]))
    }

    fn request(model: &str, messages: Vec<ChatMessage>) -> ModelRequest {
        ModelRequest { model: model.to_owned(), messages, ..ModelRequest::default() }
    }

    #[tokio::test]
    async fn two_round_script_end_to_end_with_bash_shaped_result() {
        let provider = provider_with("count", QUICKSTART);
        let mut messages = vec![ChatMessage::System { content: "be brief".into() }, user("how many lines of rust?")];

        let first = provider.complete(request("count", messages.clone())).await.expect("round 0");
        assert_eq!(first.text, None);
        assert_eq!(first.finish_reason, "tool_calls");
        assert_eq!(first.tool_calls.len(), 1);
        let call = &first.tool_calls[0];
        assert_eq!(call.id, "count");
        assert_eq!(call.name, "bash");
        let arguments: serde_json::Value = serde_json::from_str(&call.arguments).expect("arguments are json");
        assert_eq!(arguments, json!({"command": "find . -name '*.rs' -not -path './target/*' | xargs cat | wc -l"}));

        messages.push(ChatMessage::Assistant { content: None, tool_calls: first.tool_calls.clone() });
        messages.push(ChatMessage::Tool {
            tool_call_id: "count".into(),
            content: "exit_code: 0\nstdout:\n   4242\n\nstderr:\n\n".into(),
        });
        let second = provider.complete(request("count", messages.clone())).await.expect("round 1");
        assert_eq!(second.finish_reason, "stop");
        assert!(second.tool_calls.is_empty());
        assert_eq!(
            second.text.as_deref(),
            Some(
                "There are 4242 lines of Rust in this repository \
                 (counted by the runner with find | xargs cat | wc -l)."
            )
        );

        // Round 2 does not exist.
        messages.push(ChatMessage::Assistant { content: second.text.clone(), tool_calls: vec![] });
        let error = provider.complete(request("count", messages.clone())).await.expect_err("exhausted");
        assert_eq!(error.key(), "provider_error");
        assert_eq!(error.to_string(), "provider error: script exhausted at round 2");

        // A new user input restarts at round 0.
        messages.push(user("again"));
        let again = provider.complete(request("count", messages)).await.expect("round 0 again");
        assert_eq!(again.tool_calls, first.tool_calls);
    }

    #[tokio::test]
    async fn model_without_script_echoes_the_input() {
        let provider = ScriptedProvider::new("scripted", BTreeMap::new());
        let answer =
            provider.complete(request("default", vec![user("first"), user("hello there")])).await.expect("answers");
        assert_eq!(answer.text.as_deref(), Some("scripted/default has no script; input was: hello there"));
        assert_eq!(answer.finish_reason, "stop");
        assert!(answer.tool_calls.is_empty());
        assert_eq!(answer.usage, None);
    }

    #[tokio::test]
    async fn a_sink_hears_the_answer_whole() {
        let provider = provider_with("count", QUICKSTART);
        let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
        let keep = Arc::clone(&seen);
        let sink = crate::model::DeltaSink::new(move |delta| keep.lock().expect("lock").push(delta));
        let first = ModelRequest { deltas: Some(sink), ..request("count", vec![user("lines?")]) };
        let answer = provider.complete(first).await.expect("round 0");
        let call = &answer.tool_calls[0];
        assert_eq!(
            *seen.lock().expect("lock"),
            vec![
                TranscriptDelta::ToolCallStarted { index: 0, tool_call_id: call.id.clone(), name: call.name.clone() },
                TranscriptDelta::ToolCallArguments { index: 0, delta: call.arguments.clone() },
            ]
        );
    }

    #[test]
    fn bash_sections_end_at_the_next_header_even_when_empty() {
        let content = "exit_code: 0\nstdout:\nslept\nline two\nstderr: (empty)\n";
        assert_eq!(tool_field(content, "stdout").as_deref(), Some("slept\nline two"));
        assert_eq!(tool_field(content, "stderr").as_deref(), Some("(empty)"));
        assert_eq!(tool_field(content, "exit_code").as_deref(), Some("0"));
        let both = "exit_code: 1\nstdout: (empty)\nstderr:\nboom\n";
        assert_eq!(tool_field(both, "stdout").as_deref(), Some("(empty)"));
        assert_eq!(tool_field(both, "stderr").as_deref(), Some("boom\n"));
    }

    #[test]
    fn ids_are_minted_and_arguments_serialized() {
        let script = Script::from_json(
            r#"{"rounds":[{"tool_calls":[
                {"name":"read","arguments":{"path":"a"}},
                {"name":"missing_tool"},
                {"id":"raw","name":"bash","arguments":"{not json"}]},
              {"final":"done"}]}"#,
        )
        .expect("parses");
        assert_eq!(script.len(), 2);
        let answer = script.respond(&[user("go")]).expect("round 0");
        let calls: Vec<(&str, &str, &str)> = answer
            .tool_calls
            .iter()
            .map(|call| (call.id.as_str(), call.name.as_str(), call.arguments.as_str()))
            .collect();
        assert_eq!(
            calls,
            vec![
                ("call_0_0", "read", r#"{"path":"a"}"#),
                ("call_0_1", "missing_tool", "{}"),
                ("raw", "bash", "{not json"),
            ]
        );
    }

    #[test]
    fn placeholders_read_json_and_text_sections() {
        let script = Script::from_json(
            r#"{"rounds":[{"tool_calls":[{"id":"j","name":"t"},{"id":"b","name":"bash"}]},
              {"final":"in={{input}} j={{tool:j.n}}/{{ tool:j.s }} code={{tool:b.exit_code}} out=[{{tool:b.stdout}}] err=[{{tool:b.stderr}}] all=[{{tool:j}}] {{ literal"}]}"#,
        )
        .expect("parses");
        let messages = vec![
            user("q"),
            ChatMessage::Assistant { content: None, tool_calls: vec![] },
            ChatMessage::Tool { tool_call_id: "j".into(), content: r#" {"n": 7, "s": " x "} "#.into() },
            ChatMessage::Tool {
                tool_call_id: "b".into(),
                content: "exit_code: 2\nstdout:\ntotal: 5\nline two\nstderr:\noops\n".into(),
            },
        ];
        let answer = script.respond(&messages).expect("renders");
        assert_eq!(
            answer.text.as_deref(),
            Some(
                r#"in=q j=7/x code=2 out=[total: 5
line two] err=[oops] all=[{"n": 7, "s": " x "}] {{ literal"#
            )
        );
    }

    #[test]
    fn a_missing_tool_result_is_provider_error_and_a_missing_field_reads_whole() {
        let script = Script::from_json(r#"{"rounds":[{"final":"{{tool:count.stdout}}"}]}"#).expect("parses");
        let missing_id = script.respond(&[user("q")]).expect_err("no tool message");
        assert_eq!(missing_id.key(), "provider_error");
        assert!(matches!(missing_id, ModelError::Provider { .. }));

        let wrong_field = script
            .respond(&[user("q"), ChatMessage::Tool { tool_call_id: "count".into(), content: "exit_code: 0\n".into() }])
            .expect("no stdout section: the result is read whole");
        assert_eq!(wrong_field.text.as_deref(), Some("exit_code: 0"));
    }

    #[test]
    fn invalid_scripts_are_refused() {
        let rows = [
            ("not_json", "{", "json"),
            ("unknown_field", r#"{"rounds":[{"final":"x","extra":1}]}"#, "json"),
            ("no_rounds", r#"{"rounds":[]}"#, "no_rounds"),
            ("both_kinds", r#"{"rounds":[{"final":"x","tool_calls":[{"name":"a"}]}]}"#, "round"),
            ("neither_kind", r#"{"rounds":[{}]}"#, "round"),
            ("empty_tool_calls", r#"{"rounds":[{"tool_calls":[]}]}"#, "round"),
            ("dotted_id", r#"{"rounds":[{"tool_calls":[{"id":"a.b","name":"x"}]}]}"#, "round"),
            ("repeated_id", r#"{"rounds":[{"tool_calls":[{"id":"a","name":"x"},{"id":"a","name":"y"}]}]}"#, "round"),
            ("empty_name", r#"{"rounds":[{"tool_calls":[{"name":""}]}]}"#, "round"),
            ("unknown_placeholder", r#"{"rounds":[{"final":"{{output}}"}]}"#, "round"),
            ("empty_field", r#"{"rounds":[{"final":"{{tool:a.}}"}]}"#, "round"),
        ];
        for (name, text, kind) in rows {
            let error = Script::from_json(text).expect_err(name);
            let actual = match error {
                ScriptError::Json(_) => "json",
                ScriptError::NoRounds => "no_rounds",
                ScriptError::Round { round, .. } => {
                    assert_eq!(round, 0, "{name}");
                    "round"
                }
            };
            assert_eq!(actual, kind, "{name}");
        }
    }

    /// A 20 KB script of `{{input}}` against a 1 KB input would render 2 MB (and a 1 MiB input
    /// 2 GiB): the render stops at its bound with `provider_error` before building it.
    #[test]
    fn a_render_over_its_bound_is_provider_error() {
        let placeholders = "{{input}}".repeat(2_000);
        let script = Script::from_json(&json!({"rounds": [{"final": placeholders}]}).to_string()).expect("parses");
        let error = script.respond(&[user(&"x".repeat(1_000))]).expect_err("over the bound");
        assert_eq!(error.key(), "provider_error");
        let ModelError::Provider { message } = error else { panic!("provider_error") };
        assert!(message.starts_with("script round 0 renders more than 1048576 bytes"), "{message}");
        let at_bound = script.respond(&[user(&"x".repeat(RENDER_BOUND / 2_000))]).expect("within the bound");
        assert_eq!(at_bound.text.map(|text| text.len()), Some(RENDER_BOUND / 2_000 * 2_000));
    }

    #[test]
    fn quickstart_script_parses() {
        let script = Script::from_json(QUICKSTART).expect("quickstart script parses");
        assert_eq!(script.len(), 2);
        assert!(!script.is_empty());
    }
}
