//! Narrow entry points for the coverage-guided fuzz targets in `fuzz/` (`docs/fuzzing.md`).
//!
//! Not an API: each function feeds arbitrary bytes through the same parse and validation that a
//! door, a runner stream or a model script meets, and **panics** when a property that must hold
//! for every input breaks (a canonical form that does not validate to itself, a refusal outside
//! the documented words, a decoded request lost or invented). A panic is a finding: the fuzzer
//! keeps the input, and the input becomes a test at the end of this file. Pure code, no I/O.

use prost::Message;
use serde_json::{Value, json};

use nexus_proto::runner::v1::{RunnerFrame, runner_frame::Frame};
use nexus_proto::{ErrorCode, TaskKey};

use crate::actors::connection::{BATCH_BOUND, decode};
use crate::actors::executor::commit::{self, CommitRefusal, RESULT_BOUND};
use crate::actors::executor::{RunnerRequest, check_progress_frame, token_epoch};
use crate::declaration::announcement::{self, ENVIRONMENT_BOUND, TOOLS_BOUND};
use crate::declaration::approval::glob_match;
use crate::declaration::{
    ApprovalMode, CallOrigin, ValidatedProfile, decide, validate_configuration, validate_profile_put,
};
use crate::model::scripted::Script;
use crate::model::{ChatMessage, ModelError};

/// The most frames [`runner_frames`] decodes from one input (a stream's worth for one message).
pub const FRAMES_PER_INPUT: usize = 64;
/// The longest glob and text [`glob`] compares with the plain reading, in bytes each.
pub const GLOB_INPUT_BOUND: usize = 512;

/// The body of `PUT /agent_api/v1/profile/configuration` through the door's JSON parse and
/// [`validate_profile_put`] (every model reference resolves). An accepted body's canonical form
/// must validate to itself, survive the store's JSON round trip, and drive the approval stage
/// with its own rules. A refusal must carry one of the door's words.
///
/// # Panics
/// When one of those properties breaks.
pub fn profile_put(body: &[u8]) -> bool {
    // The door's parse (`doors::http`): a body that is not JSON is `parameter_missing`.
    let Ok(body) = crate::json::parse(body) else { return false };
    let accept = |_: &str| Ok(());
    let validated = match validate_profile_put(&body, &accept) {
        Ok(validated) => validated,
        Err(refusal) => {
            assert!(
                matches!(
                    refusal.code,
                    ErrorCode::ParameterMissing
                        | ErrorCode::ValidationFailed
                        | ErrorCode::PromptDocumentInvalid
                        | ErrorCode::PromptDocumentTooLarge
                        | ErrorCode::PromptDocumentMacroUnknown
                ),
                "a configuration refusal outside the door's words: {refusal:?}"
            );
            return false;
        }
    };
    let ValidatedProfile { configuration, system_prompt, summarizer } = &validated;
    let again = json!({
        "configuration": configuration,
        "prompt_documents": {"system_prompt": system_prompt, "summarizer": summarizer},
    });
    let revalidated = validate_profile_put(&again, &accept)
        .unwrap_or_else(|refusal| panic!("the canonical form is refused: {refusal:?}\n{again}"));
    assert_eq!(revalidated, validated, "the canonical form is not a fixed point");
    let object = configuration.as_object().expect("the canonical configuration is an object");
    assert_eq!(
        validate_configuration(object, &accept).as_ref(),
        Ok(configuration),
        "validate_configuration disagrees with validate_profile_put"
    );
    let stored: Value = serde_json::from_str(&configuration.to_string()).expect("stored JSON reads back");
    assert_eq!(&stored, configuration, "the configuration does not survive the store's JSON round trip");

    // The approval stage over the declaration's own rules, with the body's text as the input.
    let Some(mode) = configuration["approval_mode"].as_str().and_then(ApprovalMode::parse) else { return true };
    let rules = &configuration["approval_rules"];
    let command = body.to_string();
    let input = json!({"command": command, "argv": ["git", command], "path": "src/main.rs"});
    let tools = configuration["tool_definitions"].as_array().into_iter().flatten().filter_map(|t| t["name"].as_str());
    for tool in tools.chain(["bash", "read_file", "start_process"]) {
        for origin in [CallOrigin::Model, CallOrigin::Author, CallOrigin::Kernel] {
            let _ = decide(mode, rules, tool, &input, origin);
        }
    }
    true
}

/// A runner's `Announce.body_json` through the executor's parse and validation
/// ([`announcement::validate_json`]). An accepted announcement's canonical form must validate to
/// itself, hold its tools sorted by unique name, and stay within its bounds; a refusal must carry
/// one of the announce words.
///
/// # Panics
/// When one of those properties breaks.
pub fn announcement(body: &[u8]) -> bool {
    // The frame's field is a protobuf string: the wire carries only UTF-8.
    let Ok(body_json) = std::str::from_utf8(body) else { return false };
    check_announcement(body_json)
}

fn check_announcement(body_json: &str) -> bool {
    let canonical = match announcement::validate_json(body_json) {
        Ok(canonical) => canonical,
        Err(refusal) => {
            assert!(
                matches!(
                    refusal.code,
                    ErrorCode::ParameterMissing
                        | ErrorCode::ReservedNamespace
                        | ErrorCode::InvalidAnnouncement
                        | ErrorCode::ValidationFailed
                ),
                "an announcement refusal outside its words: {refusal:?}"
            );
            return false;
        }
    };
    let again = announcement::validate(&canonical)
        .unwrap_or_else(|refusal| panic!("the canonical announcement is refused: {refusal:?}\n{canonical}"));
    assert_eq!(again, canonical, "the canonical announcement is not a fixed point");
    let names: Vec<&str> =
        canonical["tools"].as_array().expect("tools").iter().map(|t| t["name"].as_str().expect("name")).collect();
    assert!(names.windows(2).all(|pair| pair[0] < pair[1]), "tools are not sorted by unique name: {names:?}");
    assert!(canonical["tools"].to_string().len() <= TOOLS_BOUND, "the tool list is over its bound");
    assert!(canonical["environment"].to_string().len() <= ENVIRONMENT_BOUND, "the environment is over its bound");
    true
}

/// What a request decoded from a frame is expected to be: the request id its answer repeats.
fn expected_ids(frames: &[RunnerFrame]) -> Vec<u64> {
    let mut ids = Vec::new();
    for frame in frames {
        match &frame.frame {
            Some(Frame::Batch(batch)) if batch.frames.len() > BATCH_BOUND => {
                ids.extend(batch.frames.iter().map(|inner| inner.request_id));
            }
            Some(Frame::Batch(batch)) => ids.extend(
                batch
                    .frames
                    .iter()
                    .filter(|inner| !matches!(inner.frame, Some(Frame::Pong(_))))
                    .map(|inner| inner.request_id),
            ),
            Some(Frame::Pong(_)) => {}
            _ => ids.push(frame.request_id),
        }
    }
    ids
}

/// The task key strings a frame names, each of which must parse to a key that prints back the
/// same (one spelling per key).
fn task_keys(frame: &Frame) -> Vec<&str> {
    match frame {
        Frame::Claim(c) => vec![c.task_key.as_str()],
        Frame::ClaimStatus(c) => vec![c.task_key.as_str()],
        Frame::Extend(e) => vec![e.task_key.as_str()],
        Frame::Commit(c) => vec![c.task_key.as_str()],
        Frame::Progress(p) => vec![p.task_key.as_str()],
        Frame::Batch(batch) => {
            batch.frames.iter().filter_map(|inner| inner.frame.as_ref()).flat_map(task_keys).collect()
        }
        _ => Vec::new(),
    }
}

/// Length-delimited `RunnerFrame`s (as many as decode, up to [`FRAMES_PER_INPUT`]) through the
/// connection's [`decode`] and the checks the executor applies before it reads the store: the
/// announcement's validation, the commit payload rules, the progress frame rules and the claim
/// token's epoch. Every frame but a pong must give exactly one request or refusal, in order,
/// with its request id; every task key that parses must print back as sent; an accepted commit
/// must stay within its bound and validate to itself.
///
/// # Panics
/// When one of those properties breaks.
pub fn runner_frames(bytes: &[u8]) -> usize {
    let mut rest = bytes;
    let mut frames = Vec::new();
    while !rest.is_empty() && frames.len() < FRAMES_PER_INPUT {
        match RunnerFrame::decode_length_delimited(&mut rest) {
            Ok(frame) => frames.push(frame),
            Err(_) => break,
        }
    }
    for key in frames.iter().filter_map(|frame| frame.frame.as_ref()).flat_map(task_keys) {
        if let Ok(parsed) = key.parse::<TaskKey>() {
            assert_eq!(parsed.to_string(), key, "a task key with two spellings");
        }
    }
    let expected = expected_ids(&frames);
    let (requests, _batched) = decode(frames);
    let ids: Vec<u64> = requests.iter().map(|(id, _)| *id).collect();
    assert_eq!(ids, expected, "decoding lost, invented or reordered a request");
    let mut accepted = 0;
    for (_, request) in requests {
        let Ok(request) = request else { continue };
        accepted += 1;
        match request {
            RunnerRequest::Announce(body_json) => {
                check_announcement(&body_json);
            }
            RunnerRequest::Commit { body_json, claim_token, .. } => {
                let _ = token_epoch(&claim_token);
                check_commit(&body_json);
            }
            RunnerRequest::Progress { frame_json, claim_token, .. } => {
                let _ = token_epoch(&claim_token);
                let _ = check_progress_frame(&frame_json);
            }
            RunnerRequest::ClaimStatus { claim_token, .. } | RunnerRequest::Extend { claim_token, .. } => {
                let _ = token_epoch(&claim_token);
            }
            RunnerRequest::Claim { .. } => {}
        }
    }
    accepted
}

fn check_commit(body_json: &str) {
    match commit::validate(body_json) {
        Ok(body) => {
            let text = body.stored.to_string();
            assert!(text.len() <= RESULT_BOUND, "an accepted result is over its bound");
            let again = commit::validate(&text)
                .unwrap_or_else(|refusal| panic!("a stored result is refused when committed again: {refusal:?}"));
            assert_eq!(again, body, "a stored result is not a fixed point");
        }
        Err(CommitRefusal::Standing(_) | CommitRefusal::Closes(_)) => {}
    }
}

/// A scripted-model script ([`Script::from_json`]); when it parses, every round is played: round
/// `i` answers a transcript with `i` assistant turns after the user's input, each tool call
/// answered with the input's text as its result. Every round the script has must answer (a
/// missing tool result aside), with unique call ids, and the round after the last must be
/// `script exhausted`.
///
/// # Panics
/// When one of those properties breaks.
pub fn scripted_script(bytes: &[u8]) -> bool {
    let Ok(text) = std::str::from_utf8(bytes) else { return false };
    let Ok(script) = Script::from_json(text) else { return false };
    assert!(!script.is_empty(), "a parsed script has at least one round");
    let mut transcript = vec![ChatMessage::User { content: text.to_owned() }];
    for round in 0..script.len() {
        let response = match script.respond(&transcript) {
            Ok(response) => response,
            Err(ModelError::Provider { message }) => {
                assert!(!message.contains("exhausted"), "round {round} of {} is exhausted", script.len());
                return true;
            }
            Err(other) => panic!("a script answers only provider_error: {other:?}"),
        };
        let mut ids: Vec<&str> = response.tool_calls.iter().map(|call| call.id.as_str()).collect();
        ids.sort_unstable();
        assert!(ids.windows(2).all(|pair| pair[0] != pair[1]), "round {round} repeats a call id: {ids:?}");
        let results: Vec<ChatMessage> = response
            .tool_calls
            .iter()
            .map(|call| ChatMessage::Tool { tool_call_id: call.id.clone(), content: text.to_owned() })
            .collect();
        transcript.push(ChatMessage::Assistant { content: response.text, tool_calls: response.tool_calls });
        transcript.extend(results);
    }
    match script.respond(&transcript) {
        Err(ModelError::Provider { message }) => assert!(message.contains("exhausted"), "{message}"),
        other => panic!("the round after the last must be exhausted, not {other:?}"),
    }
    true
}

/// The approval glob against the plain dynamic-programming reading (`*` any bytes, `?` one
/// byte): the first `0xFF` byte splits the input into glob and text (each cut to
/// [`GLOB_INPUT_BOUND`] bytes; invalid UTF-8 replaced).
///
/// # Panics
/// When [`glob_match`] and the plain reading disagree.
pub fn glob(bytes: &[u8]) -> bool {
    let (pattern, text) = match bytes.iter().position(|&b| b == 0xFF) {
        Some(at) => (&bytes[..at], &bytes[at + 1..]),
        None => (bytes, &[][..]),
    };
    let pattern = String::from_utf8_lossy(&pattern[..pattern.len().min(GLOB_INPUT_BOUND)]).into_owned();
    let text = String::from_utf8_lossy(&text[..text.len().min(GLOB_INPUT_BOUND)]).into_owned();
    let matched = glob_match(&pattern, &text);
    assert_eq!(matched, plain_glob(pattern.as_bytes(), text.as_bytes()), "{pattern:?} against {text:?}");
    matched
}

/// The plain dynamic-programming reading of a glob (`*` any bytes, `?` one byte), in time
/// `pattern × text`: what the linear matcher is checked against, here and in its unit tests.
pub(crate) fn plain_glob(pattern: &[u8], text: &[u8]) -> bool {
    let mut row = vec![false; text.len() + 1];
    row[0] = true;
    for &p in pattern {
        let mut next = vec![false; text.len() + 1];
        if p == b'*' {
            let mut any = false;
            for t in 0..=text.len() {
                any |= row[t];
                next[t] = any;
            }
        } else {
            for t in 0..text.len() {
                next[t + 1] = row[t] && (p == b'?' || p == text[t]);
            }
        }
        row = next;
    }
    row[text.len()]
}

#[cfg(test)]
mod tests {
    use nexus_proto::runner::v1::{Claim, Commit, Pong, RunnerBatch};

    use super::*;

    fn frame(request_id: u64, frame: Frame) -> RunnerFrame {
        RunnerFrame { request_id, frame: Some(frame) }
    }

    fn stream(frames: &[RunnerFrame]) -> Vec<u8> {
        let mut bytes = Vec::new();
        for frame in frames {
            frame.encode_length_delimited(&mut bytes).expect("encodes");
        }
        bytes
    }

    /// The seeds in `fuzz/seeds/` are inputs of this kind: each passes, and each reaches the
    /// properties past the parse.
    #[test]
    fn entry_points_hold_on_valid_inputs() {
        assert!(profile_put(
            br#"{"configuration":{"approval_mode":"rules","approval_rules":[{"tool":"ba?h|*","path":"command","match":"*rm*","verdict":"deny"}]},"prompt_documents":{"system_prompt":{"content":"hi"}}}"#,
        ));
        assert!(!profile_put(br#"{"configuration":{"approval_mode":"sometimes"}}"#));
        assert!(announcement(
            br#"{"tools":[{"name":"b","effect_profile":{"kind":"read_only","destructive":false,"effect_scope":"open","idempotency":"none","reconciliation":"none"}},{"name":"a","timeout_ms":5,"effect_profile":{"kind":"write","destructive":true,"effect_scope":"open","idempotency":"none","reconciliation":"none"}}]}"#
        ));
        assert!(!announcement(br#"{"tools":[{"name":"a b"}]}"#));
        assert!(scripted_script(
            br#"{"rounds":[{"tool_calls":[{"name":"bash"}]},{"final":"{{tool:call_0_0.stdout}} {{input}}"}]}"#
        ));
        assert!(!scripted_script(br#"{"rounds":[]}"#));
        assert!(glob(b"a*b?\xFFaxxbc"));
        assert!(!glob(b"a*b?\xFFaxxb"));
        let run = uuid::Uuid::nil().to_string();
        let claim = Claim { run_public_id: run.clone(), task_key: "r1t0".into() };
        let commit = Commit {
            run_public_id: run,
            task_key: "h2-turn_start-g3".into(),
            claim_token: "e1.x".into(),
            body_json: r#"{"content":[{"type":"text","text":"a"}],"title":"t"}"#.into(),
        };
        let batch =
            RunnerBatch { frames: vec![frame(7, Frame::Pong(Pong::default())), frame(8, Frame::Claim(claim.clone()))] };
        let frames = [frame(1, Frame::Claim(claim)), frame(2, Frame::Commit(commit)), frame(3, Frame::Batch(batch))];
        assert_eq!(runner_frames(&stream(&frames)), 3);
    }

    /// The inputs kept in `fuzz/regressions/`, each a finding fixed at its root: the properties
    /// hold on them, and each reaches past its parse.
    #[test]
    fn regressions_hold() {
        // `*` + 30,000 `a` + `b` against 60 KB of `a`: 1.8e9 backtracking steps before the glob
        // matcher was bounded (`approval::tests::glob_work_is_bounded_on_hostile_rules`).
        assert!(profile_put(include_bytes!("../../fuzz/regressions/configuration/glob_backtracking")));
        // 2,000 `{{input}}` against the script's own 18 KB text: a 36 MB answer before the render
        // was bounded (`scripted::tests::a_render_over_its_bound_is_provider_error`).
        assert!(scripted_script(include_bytes!("../../fuzz/regressions/scripted_script/render_amplification")));
    }
}
