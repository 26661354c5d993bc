//! The pure part of the lifecycle hooks: the boundaries, the hook task's input, and the reading
//! and judging of a hook's decision (`docs/executions.md`, "Lifecycle hooks"). No I/O: the
//! ExecutionActor ([`super`]) writes, offers and narrates what these functions decide.

use serde_json::{Value, json};

use nexus_proto::{ConversationId, ErrorCode, ExecutionId, LifecycleEvent};

use crate::declaration::FrozenDeclaration;

/// The largest `feedback` of a decision, in bytes (16 KiB).
pub const FEEDBACK_BOUND: usize = 16_384;
/// The largest `output_preview` a `stop` hook gets, in bytes (cut at a character boundary);
/// `output_size_bytes` gives the whole answer's size.
pub const OUTPUT_PREVIEW_BOUND: usize = 4_096;

pub use crate::declaration::compaction::CompactionTrigger;

/// A hook boundary, as the driver reaches it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HookEvent<'a> {
    /// Before the first model round of the execution. Fires only while no round has started.
    TurnStart,
    /// Before actual compaction work on model round `round` (not on every size check).
    PreCompact {
        /// The model round being compacted (the source, `r{round}`).
        round: i64,
        /// What made compaction run.
        trigger: CompactionTrigger,
        /// How far over the bound the request was, in bytes, when known.
        overshoot_bytes: Option<u64>,
        /// How far over the window the request was, in tokens, when known.
        overshoot_tokens: Option<u64>,
    },
    /// After compaction of model round `round`, before the execution proceeds.
    PostCompact {
        /// The model round that was compacted (the source, `r{round}`).
        round: i64,
    },
    /// A normal final answer of the current round is ready.
    Stop {
        /// The candidate answer.
        output: &'a str,
    },
}

impl HookEvent<'_> {
    /// The event, as `lifecycle_hooks` names it.
    pub fn name(&self) -> LifecycleEvent {
        match self {
            HookEvent::TurnStart => LifecycleEvent::TurnStart,
            HookEvent::PreCompact { .. } => LifecycleEvent::PreCompact,
            HookEvent::PostCompact { .. } => LifecycleEvent::PostCompact,
            HookEvent::Stop { .. } => LifecycleEvent::Stop,
        }
    }

    /// The model round this boundary concerns, given the last round started.
    pub(super) fn source_round(&self, current: i64) -> i64 {
        match self {
            HookEvent::TurnStart => current + 1,
            HookEvent::PreCompact { round, .. } | HookEvent::PostCompact { round } => *round,
            HookEvent::Stop { .. } => current,
        }
    }
}

/// A hook decision that lets the execution go on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    /// `continue:false`: acknowledged (any event), or the answer is accepted (`stop`).
    Proceed,
    /// `continue:true` on `stop`: run another model round with this feedback as its prompt.
    Continue(String),
}

/// One declared hook, as frozen.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Declared {
    pub(super) tool: String,
    pub(super) timeout_ms: i64,
    pub(super) max_continuations: u64,
}

pub(super) fn declared(declaration: &FrozenDeclaration, event: LifecycleEvent) -> Option<Declared> {
    let entry = declaration.lifecycle_hooks.get(event.as_str())?;
    Some(Declared {
        tool: entry["tool"].as_str()?.to_owned(),
        timeout_ms: entry["timeout_ms"].as_i64()?,
        max_continuations: entry["max_continuations"].as_u64().unwrap_or(0),
    })
}

/// The origin's hook input for `event` on the source round `source` (`r{n}`) of execution `run`.
pub fn hook_input(
    event: &HookEvent<'_>,
    source: &str,
    run: ExecutionId,
    conversation: Option<ConversationId>,
) -> Value {
    let mut input = json!({
        "event": event.name(),
        "task_key": source,
        "run_public_id": run,
        "conversation_public_id": conversation,
    });
    match event {
        HookEvent::Stop { output } => {
            input["output_preview"] = json!(preview(output));
            input["output_size_bytes"] = json!(output.len());
        }
        HookEvent::PreCompact { trigger, overshoot_bytes, overshoot_tokens, .. } => {
            input["compaction_trigger"] = json!(trigger);
            if let Some(bytes) = overshoot_bytes {
                input["overshoot_bytes"] = json!(bytes);
            }
            if let Some(tokens) = overshoot_tokens {
                input["overshoot_tokens"] = json!(tokens);
            }
        }
        HookEvent::TurnStart | HookEvent::PostCompact { .. } => {}
    }
    input
}

/// The first [`OUTPUT_PREVIEW_BOUND`] bytes of `text`, cut back to a character boundary.
fn preview(text: &str) -> &str {
    let mut end = text.len().min(OUTPUT_PREVIEW_BOUND);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// Reads the decision of a completed hook task of `event` from its stored result
/// (`docs/executions.md`, "Lifecycle hooks"). Continuation limits are judged by [`judge`].
///
/// # Errors
/// `(hook_error, message)` when the commit had `is_error:true`; `(invalid_hook_result, message)`
/// for a malformed decision.
pub fn read_decision(event: LifecycleEvent, result: Option<&Value>) -> Result<Decision, (ErrorCode, String)> {
    let result = result.unwrap_or(&Value::Null);
    let invalid = |message: String| (ErrorCode::InvalidHookResult, message);
    if result["is_error"] == Value::Bool(true) {
        return Err((
            ErrorCode::HookError,
            "the hook tool's commit had is_error:true; fix the hook tool, then retry the hook or abandon it".into(),
        ));
    }
    let Some(decision) = result.get("structured_content").and_then(Value::as_object) else {
        return Err(invalid("structured_content must be an object {continue, feedback?}".into()));
    };
    if let Some(key) = decision.keys().find(|k| !matches!(k.as_str(), "continue" | "feedback")) {
        return Err(invalid(format!(
            "structured_content.{key} is not allowed; a decision has only continue and feedback"
        )));
    }
    let Some(go_on) = decision.get("continue").and_then(Value::as_bool) else {
        return Err(invalid("structured_content.continue is required and must be a boolean".into()));
    };
    let feedback = match decision.get("feedback") {
        None => None,
        Some(Value::String(feedback)) => Some(feedback),
        Some(_) => return Err(invalid("structured_content.feedback must be a string".into())),
    };
    if let Some(feedback) = feedback {
        if feedback.len() > FEEDBACK_BOUND {
            return Err(invalid(format!(
                "structured_content.feedback is {} bytes, over its bound of {FEEDBACK_BOUND}",
                feedback.len()
            )));
        }
        if feedback.contains('\0') {
            return Err(invalid("structured_content.feedback contains NUL".into()));
        }
    }
    if !go_on {
        return Ok(Decision::Proceed);
    }
    if event != LifecycleEvent::Stop {
        return Err(invalid(format!("a {event} hook may only acknowledge: continue must be false")));
    }
    match feedback.filter(|f| !f.trim().is_empty()) {
        Some(feedback) => Ok(Decision::Continue(feedback.clone())),
        None => Err(invalid("continue:true needs non-blank structured_content.feedback".into())),
    }
}

/// What an execution knows when it judges a `stop` hook's continuation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Continuations {
    /// Whether the execution had a model round (a continuation continues it).
    pub had_model_round: bool,
    /// Continuations granted so far.
    pub granted: u64,
    /// The hook's `max_continuations`.
    pub max: u64,
}

/// The decision of a completed hook task of `event`: [`read_decision`], then the `stop`
/// continuation limits.
///
/// # Errors
/// As [`read_decision`]; `(hook_requires_model, _)` for a continuation with no model round to
/// continue; `(stop_hook_limit, _)` for one past `max_continuations`.
pub fn judge(
    event: LifecycleEvent,
    result: Option<&Value>,
    continuations: Continuations,
) -> Result<Decision, (ErrorCode, String)> {
    let decision = read_decision(event, result)?;
    if matches!(decision, Decision::Continue(_)) {
        if !continuations.had_model_round {
            return Err((
                ErrorCode::HookRequiresModel,
                "the stop hook asked for another model round, but this execution has no model round to continue".into(),
            ));
        }
        if continuations.granted >= continuations.max {
            return Err((
                ErrorCode::StopHookLimit,
                format!(
                    "the stop hook asked for continuation {} but max_continuations is {}; abandon the hook to \
                     deliver the answer",
                    continuations.granted + 1,
                    continuations.max
                ),
            ));
        }
    }
    Ok(decision)
}

#[cfg(test)]
mod tests {
    use nexus_proto::TaskKey;

    use super::*;

    #[test]
    fn hook_keys_name_the_event_the_source_and_the_generation() {
        let rows = [
            ("h1-turn_start", Some((1, "turn_start", 1))),
            ("h3-stop", Some((3, "stop", 1))),
            ("h3-stop-g2", Some((3, "stop", 2))),
            ("h12-pre_compact-g10", Some((12, "pre_compact", 10))),
            ("h2-post_compact", Some((2, "post_compact", 1))),
            ("h3-stop-g1", None),
            ("h3-stop-g", None),
            ("h-stop", None),
            ("hx-stop", None),
            ("h3-session_end", None),
            ("r1t0", None),
            ("h3stop", None),
        ];
        for (text, expected) in rows {
            let parsed = text.parse::<TaskKey>().ok().and_then(|key| match key {
                TaskKey::Hook { round, event, generation } => Some((round, event.as_str(), generation)),
                _ => None,
            });
            assert_eq!(parsed, expected, "{text}");
            if let Ok(key) = text.parse::<TaskKey>() {
                assert_eq!(key.to_string(), text, "{text} round-trips");
            }
        }
        let retry = TaskKey::Hook { round: 3, event: LifecycleEvent::Stop, generation: 2 };
        assert_eq!(retry.first_generation().to_string(), "h3-stop");
        assert_eq!(
            "h1-turn_start".parse::<TaskKey>().ok().and_then(TaskKey::hook_event),
            Some(LifecycleEvent::TurnStart)
        );
        assert!(!"r1t0".parse::<TaskKey>().expect("a key").is_hook());
    }

    #[test]
    fn r56_decisions_and_their_failure_words() {
        let stop = |content: Value| {
            read_decision(LifecycleEvent::Stop, Some(&json!({"structured_content": content, "is_error": false})))
        };
        let word = |r: Result<Decision, (ErrorCode, String)>| r.map_err(|(code, _)| code.as_str());
        let rows: [(&str, Value, Result<Decision, &str>); 13] = [
            ("accept", json!({"continue": false}), Ok(Decision::Proceed)),
            ("accept_with_feedback", json!({"continue": false, "feedback": "fine"}), Ok(Decision::Proceed)),
            ("continue", json!({"continue": true, "feedback": "more"}), Ok(Decision::Continue("more".into()))),
            ("continue_without_feedback", json!({"continue": true}), Err("invalid_hook_result")),
            ("continue_blank_feedback", json!({"continue": true, "feedback": " \n\t"}), Err("invalid_hook_result")),
            ("continue_missing", json!({"feedback": "x"}), Err("invalid_hook_result")),
            ("continue_not_bool", json!({"continue": "yes"}), Err("invalid_hook_result")),
            ("extra_key", json!({"continue": false, "reason": "x"}), Err("invalid_hook_result")),
            ("feedback_not_string", json!({"continue": false, "feedback": 1}), Err("invalid_hook_result")),
            ("feedback_nul", json!({"continue": true, "feedback": "a\u{0}b"}), Err("invalid_hook_result")),
            (
                "feedback_over_16_kib",
                json!({"continue": true, "feedback": "x".repeat(FEEDBACK_BOUND + 1)}),
                Err("invalid_hook_result"),
            ),
            ("not_an_object", json!([true]), Err("invalid_hook_result")),
            ("null", Value::Null, Err("invalid_hook_result")),
        ];
        for (name, content, expected) in rows {
            assert_eq!(word(stop(content)), expected, "{name}");
        }
        let at_bound = json!({"continue": true, "feedback": "x".repeat(FEEDBACK_BOUND)});
        assert!(stop(at_bound).is_ok(), "16 KiB of feedback is allowed");
        assert_eq!(
            word(read_decision(LifecycleEvent::Stop, Some(&json!({"content": "no structure"})))),
            Err("invalid_hook_result")
        );
        assert_eq!(word(read_decision(LifecycleEvent::Stop, None)), Err("invalid_hook_result"));
        let errored = json!({"structured_content": {"continue": false}, "is_error": true});
        assert_eq!(word(read_decision(LifecycleEvent::Stop, Some(&errored))), Err("hook_error"));
        for event in [LifecycleEvent::TurnStart, LifecycleEvent::PreCompact, LifecycleEvent::PostCompact] {
            let ack = json!({"structured_content": {"continue": false}});
            assert_eq!(read_decision(event, Some(&ack)), Ok(Decision::Proceed), "{event}");
            let go_on = json!({"structured_content": {"continue": true, "feedback": "more"}});
            assert_eq!(word(read_decision(event, Some(&go_on))), Err("invalid_hook_result"), "{event}");
        }
    }

    #[test]
    fn the_hook_input_is_the_origins() {
        let run = ExecutionId::new_v4();
        let conversation = ConversationId::new_v4();
        let answer = "é".repeat(3_000);
        let stop = hook_input(&HookEvent::Stop { output: &answer }, "r2", run, Some(conversation));
        assert_eq!(stop["event"], "stop");
        assert_eq!(stop["task_key"], "r2");
        assert_eq!(stop["run_public_id"], json!(run));
        assert_eq!(stop["conversation_public_id"], json!(conversation));
        assert_eq!(stop["output_size_bytes"], 6_000);
        let shown = stop["output_preview"].as_str().expect("preview");
        assert_eq!(shown.len(), OUTPUT_PREVIEW_BOUND, "cut at a character boundary at the bound");
        let start = hook_input(&HookEvent::TurnStart, "r1", run, None);
        assert_eq!(
            start,
            json!({"event": "turn_start", "task_key": "r1", "run_public_id": run, "conversation_public_id": null})
        );
        let pre = HookEvent::PreCompact {
            round: 4,
            trigger: CompactionTrigger::Overflow,
            overshoot_bytes: Some(10),
            overshoot_tokens: None,
        };
        let input = hook_input(&pre, "r4", run, None);
        assert_eq!(
            (input["compaction_trigger"].as_str(), input["overshoot_bytes"].as_u64()),
            (Some("overflow"), Some(10))
        );
        assert!(input.get("overshoot_tokens").is_none());
        assert_eq!(pre.source_round(9), 4);
        assert_eq!(HookEvent::TurnStart.source_round(0), 1);
        assert_eq!(HookEvent::Stop { output: "" }.source_round(3), 3);
    }

    #[test]
    fn r55_a_hook_tool_is_never_imported_for_the_model() {
        let runner = nexus_proto::RunnerId::new_v4();
        let tool = |name: &str| json!({"name": name, "description": "d", "input_schema": {"type": "object"}});
        let facts = crate::declaration::RunnerFacts {
            public_id: runner,
            display_name: "worker".into(),
            eligibility: crate::declaration::Eligibility::Eligible,
            announcement: json!({"tools": [tool("probe"), tool("review")], "environment": {}, "documents": []}),
        };
        let configuration = json!({
            "runner_executor_public_ids": [runner],
            "approval_mode": "bypass",
            "lifecycle_hooks": {"stop": {"tool": "review", "timeout_ms": 1000, "max_continuations": 1}},
        });
        let selection = crate::declaration::tools::RunnerSelection::FirstEligible;
        let frozen = crate::declaration::freeze(&configuration, None, selection, &[facts], None).expect("frozen");
        let names: Vec<&str> = frozen.tools.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(names, ["probe"]);
        assert_eq!(
            declared(&frozen, LifecycleEvent::Stop),
            Some(Declared { tool: "review".into(), timeout_ms: 1000, max_continuations: 1 })
        );
        assert_eq!(declared(&frozen, LifecycleEvent::TurnStart), None);
    }

    #[test]
    fn a_continuation_needs_a_model_round_and_room_under_the_limit() {
        let go_on = json!({"structured_content": {"continue": true, "feedback": "more"}});
        let ack = json!({"structured_content": {"continue": false}});
        let room = Continuations { had_model_round: true, granted: 1, max: 2 };
        assert_eq!(judge(LifecycleEvent::Stop, Some(&go_on), room), Ok(Decision::Continue("more".into())));
        let word =
            |c: Continuations, result: &Value| judge(LifecycleEvent::Stop, Some(result), c).map_err(|(code, _)| code);
        assert_eq!(word(Continuations { granted: 2, ..room }, &go_on), Err(ErrorCode::StopHookLimit));
        assert_eq!(word(Continuations { max: 0, granted: 0, ..room }, &go_on), Err(ErrorCode::StopHookLimit));
        assert_eq!(word(Continuations { had_model_round: false, ..room }, &go_on), Err(ErrorCode::HookRequiresModel));
        // An acknowledgement is never limited.
        assert_eq!(word(Continuations { had_model_round: false, granted: 9, max: 0 }, &ack), Ok(Decision::Proceed));
        let message = judge(LifecycleEvent::Stop, Some(&go_on), Continuations { granted: 2, ..room }).unwrap_err().1;
        assert!(message.contains("continuation 3") && message.contains("max_continuations is 2"), "{message}");
    }
}
