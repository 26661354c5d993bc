//! The pure part of compaction: the policy, the summary task keys, what a compaction replaces and
//! keeps, the summarizer's and the delegate's inputs, and whether a round must be compacted
//! (`docs/executions.md`, "Compaction"). No I/O: the driver ([`super`]) measures, writes and
//! calls what these functions decide.

use serde_json::{Value, json};

use nexus_proto::{ExecutionId, TaskKey};

use crate::declaration::FrozenDeclaration;
use crate::declaration::compaction::{CompactionMode, CompactionTrigger};
use crate::model::ChatMessage;

/// The largest `tool_input` of a delegate summary task, in bytes of JSON (64 KiB).
pub const DELEGATE_INPUT_BOUND: usize = super::super::TOOL_INPUT_BOUND;
/// The first line of the assistant message that replaces the compacted history.
pub const SUMMARY_HEADER: &str = "Summary of the earlier part of this conversation (context compacted):";
/// The callable name of a kernel summary task.
pub const SUMMARIZER: &str = "summarizer";
/// The summarizer's instructions when the declaration has no `summarizer` document.
pub const DEFAULT_INSTRUCTIONS: &str = "You compact the history of an agent's conversation. Write a concise summary \
     from which the agent can continue the work without the original messages: keep every decision, fact learned, \
     open question and obligation, and pointers to results (file paths, identifiers, commands, URLs). The user's \
     messages are kept verbatim elsewhere; do not repeat them. Answer with the summary only.";

/// An enabled `compaction_policy`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Policy {
    /// `kernel` or `delegate`.
    pub mode: CompactionMode,
    /// The delegate's tool (required by the grammar for `delegate`).
    pub tool_name: Option<String>,
    /// The kernel summarizer's model reference; the execution's current model when absent.
    pub model: Option<String>,
}

/// The enabled policy of a declaration; `None` for a null or absent policy and for `mode: off`.
pub fn policy(declaration: &FrozenDeclaration) -> Option<Policy> {
    let policy = &declaration.compaction_policy;
    let mode = match policy["mode"].as_str()? {
        "kernel" => CompactionMode::Kernel,
        "delegate" => CompactionMode::Delegate,
        _ => return None,
    };
    let text = |key: &str| policy[key].as_str().filter(|s| !s.is_empty()).map(str::to_owned);
    Some(Policy { mode, tool_name: text("tool_name"), model: text("model") })
}

/// The key of the summary task of source round `source`: `c{source}-summary`.
pub fn summary_key(source: i64) -> TaskKey {
    TaskKey::Summary { round: source, fallback: false }
}

/// The key of the kernel fallback of a delegate nobody answered: `c{source}-summary-fallback`.
pub fn fallback_key(source: i64) -> TaskKey {
    TaskKey::Summary { round: source, fallback: true }
}

/// The source round of a summary task's key, and whether it is the fallback; `None` for any
/// other key.
pub fn parse_key(key: TaskKey) -> Option<(i64, bool)> {
    match key {
        TaskKey::Summary { round, fallback } => Some((round, fallback)),
        _ => None,
    }
}

/// What one compaction replaces: the messages before `tail_start` that are neither system nor
/// user messages. Everything from `tail_start` on is the retained tail.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Plan {
    /// The first message of the retained tail.
    pub tail_start: usize,
    /// The indices of the compacted messages, in order.
    pub compacted: Vec<usize>,
}

/// Plans the compaction of `transcript` (see the module docs, "What survives"); `None` when there
/// is nothing to compact.
pub fn plan(transcript: &[ChatMessage]) -> Option<Plan> {
    let answered = crate::model::answered_calls(transcript);
    let last_round = transcript.iter().rposition(|m| matches!(m, ChatMessage::Assistant { .. }))?;
    let unresolved = transcript.iter().position(|m| match m {
        ChatMessage::Assistant { tool_calls, .. } => tool_calls.iter().any(|c| !answered.contains(c.id.as_str())),
        _ => false,
    });
    let tail_start = unresolved.map_or(last_round, |first| first.min(last_round));
    let compacted: Vec<usize> = transcript[..tail_start]
        .iter()
        .enumerate()
        .filter(|(_, m)| matches!(m, ChatMessage::Assistant { .. } | ChatMessage::Tool { .. }))
        .map(|(i, _)| i)
        .collect();
    (!compacted.is_empty()).then_some(Plan { tail_start, compacted })
}

/// The transcript after compaction: the system and user messages before the tail as they were,
/// then one assistant message carrying `summary` under [`SUMMARY_HEADER`], then the tail.
pub fn compacted_transcript(transcript: &[ChatMessage], plan: &Plan, summary: &str) -> Vec<ChatMessage> {
    let mut out: Vec<ChatMessage> = transcript[..plan.tail_start]
        .iter()
        .filter(|m| is_document(m) || matches!(m, ChatMessage::User { .. }))
        .cloned()
        .collect();
    out.push(ChatMessage::Assistant {
        content: Some(format!("{SUMMARY_HEADER}\n\n{}", summary.trim())),
        tool_calls: vec![],
    });
    out.extend(transcript[plan.tail_start..].iter().cloned());
    out
}

/// Whether `message` is a document (system or developer), which compaction never summarizes.
fn is_document(message: &ChatMessage) -> bool {
    matches!(message, ChatMessage::System { .. } | ChatMessage::Developer { .. })
}

/// One message as the kernel summarizer reads it.
fn render(message: &ChatMessage) -> String {
    match message {
        ChatMessage::System { content } => format!("[system] {content}"),
        ChatMessage::Developer { content } => format!("[developer] {content}"),
        ChatMessage::User { content } => format!("[user, kept verbatim] {content}"),
        ChatMessage::Assistant { content, tool_calls } => {
            let mut lines = Vec::new();
            if let Some(text) = content.as_deref().filter(|t| !t.is_empty()) {
                lines.push(format!("[assistant] {text}"));
            }
            for call in tool_calls {
                lines.push(format!("[assistant called {} as {}] {}", call.name, call.id, call.arguments));
            }
            lines.join("\n")
        }
        ChatMessage::Tool { tool_call_id, content } => format!("[result of {tool_call_id}] {content}"),
    }
}

/// The kernel summarizer's user message over the history before the tail, at most `bound`
/// bytes: the oldest messages are trimmed first.
pub fn summarizer_input(transcript: &[ChatMessage], plan: &Plan, bound: usize) -> String {
    let mut entries: Vec<String> =
        transcript[..plan.tail_start].iter().filter(|m| !is_document(m)).map(render).collect();
    let head = "Summarize this conversation history:\n\n";
    let mut size: usize = head.len() + entries.iter().map(|e| e.len() + 2).sum::<usize>();
    let mut trimmed = 0;
    while size > bound && !entries.is_empty() {
        size -= entries.remove(0).len() + 2;
        trimmed += 1;
    }
    let mut text = head.to_owned();
    if trimmed > 0 {
        text.push_str(&format!("[{trimmed} older message(s) trimmed]\n\n"));
    }
    text.push_str(&entries.join("\n\n"));
    text
}

/// The delegate's `tool_input {history, retained_tail, run_public_id, task}`: the history before
/// the tail (system messages aside) and the tail, as stored messages, within `bound` bytes of
/// JSON, the oldest history trimmed first, then the oldest of the tail.
pub fn delegate_input(transcript: &[ChatMessage], plan: &Plan, run: ExecutionId, task: &str, bound: usize) -> Value {
    let as_values = |messages: &[ChatMessage]| -> Vec<Value> {
        messages.iter().filter(|m| !is_document(m)).filter_map(|m| serde_json::to_value(m).ok()).collect()
    };
    let mut history = as_values(&transcript[..plan.tail_start]);
    let mut tail = as_values(&transcript[plan.tail_start..]);
    let shape = |history: &[Value], tail: &[Value]| json!({"history": history, "retained_tail": tail, "run_public_id": run, "task": task});
    let base = shape(&[], &[]).to_string().len();
    let cost = |v: &Value| v.to_string().len() + 1;
    let mut size = base + history.iter().map(cost).sum::<usize>() + tail.iter().map(cost).sum::<usize>();
    while size > bound && !history.is_empty() {
        size -= cost(&history.remove(0));
    }
    while size > bound && !tail.is_empty() {
        size -= cost(&tail.remove(0));
    }
    shape(&history, &tail)
}

/// The longest summarizer input for a model with a window of `window_tokens`: the compaction
/// threshold's share of the window, in bytes at [`ESTIMATE_BYTES_PER_TOKEN`] bytes per token.
///
/// [`ESTIMATE_BYTES_PER_TOKEN`]: super::super::control::ESTIMATE_BYTES_PER_TOKEN
pub fn summarizer_bound(window_tokens: u64, threshold_percent: u64) -> usize {
    let per_token = super::super::control::ESTIMATE_BYTES_PER_TOKEN as u64;
    let window_bytes = window_tokens.saturating_mul(per_token);
    usize::try_from(window_bytes.saturating_mul(threshold_percent) / 100).unwrap_or(usize::MAX)
}

/// What the driver measured of the next request, for [`trigger`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Measure {
    /// The request's canonical JSON (messages and tools), in bytes.
    pub request_bytes: u64,
    /// `[execution] request_bytes_bound`.
    pub request_bytes_bound: u64,
    /// The provider's input token count of the last round, when the last round reported one.
    pub last_round_tokens: Option<u64>,
    /// The retained tail (what the last round added), in bytes of JSON.
    pub tail_bytes: u64,
    /// The model's window, in tokens (`context_window_tokens`).
    pub window_tokens: u64,
    /// `[execution] compaction_threshold_percent`.
    pub threshold_percent: u64,
}

/// Why a round must be compacted before it runs, with how far over its bound it is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Detected {
    /// `wall` or `usage` (`overflow` and `manual` are decided elsewhere).
    pub trigger: CompactionTrigger,
    /// Bytes over `request_bytes_bound`.
    pub overshoot_bytes: Option<u64>,
    /// Tokens over the threshold (`usage`) or the window (`wall`, estimated).
    pub overshoot_tokens: Option<u64>,
}

/// Whether the next request must be compacted first (see the module docs of [`super`],
/// "Triggers"): over the byte bound (`wall`); else, with a provider count for the last round, that
/// count plus the tail's estimate over the threshold (`usage`); else the whole request's estimate
/// over the window (`wall`). Estimates count [`ESTIMATE_BYTES_PER_TOKEN`] bytes per token.
///
/// [`ESTIMATE_BYTES_PER_TOKEN`]: super::super::control::ESTIMATE_BYTES_PER_TOKEN
pub fn trigger(measure: &Measure) -> Option<Detected> {
    let per_token = super::super::control::ESTIMATE_BYTES_PER_TOKEN as u64;
    let tokens = |bytes: u64| bytes.div_ceil(per_token);
    if measure.request_bytes > measure.request_bytes_bound {
        return Some(Detected {
            trigger: CompactionTrigger::Wall,
            overshoot_bytes: Some(measure.request_bytes - measure.request_bytes_bound),
            overshoot_tokens: None,
        });
    }
    match measure.last_round_tokens {
        Some(input_tokens) => {
            let threshold = measure.window_tokens.saturating_mul(measure.threshold_percent) / 100;
            let total = input_tokens.saturating_add(tokens(measure.tail_bytes));
            (total > threshold).then(|| Detected {
                trigger: CompactionTrigger::Usage,
                overshoot_bytes: None,
                overshoot_tokens: Some(total - threshold),
            })
        }
        None => {
            let estimated = tokens(measure.request_bytes);
            (estimated > measure.window_tokens).then(|| Detected {
                trigger: CompactionTrigger::Wall,
                overshoot_bytes: None,
                overshoot_tokens: Some(estimated - measure.window_tokens),
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::ToolCall;

    fn call(id: &str) -> ToolCall {
        ToolCall { id: id.into(), name: "bash".into(), arguments: "{}".into(), model_id: None }
    }

    fn assistant(calls: &[&str]) -> ChatMessage {
        ChatMessage::Assistant { content: None, tool_calls: calls.iter().map(|id| call(id)).collect() }
    }

    fn result(id: &str) -> ChatMessage {
        ChatMessage::Tool { tool_call_id: id.into(), content: format!("result {id}") }
    }

    fn user(text: &str) -> ChatMessage {
        ChatMessage::User { content: text.into() }
    }

    #[test]
    fn summary_keys_name_the_source_round() {
        let rows = [
            ("c3-summary", Some((3, false))),
            ("c12-summary-fallback", Some((12, true))),
            ("c-summary", None),
            ("cx-summary", None),
            ("c3-summaries", None),
            ("r3t0", None),
            ("h3-pre_compact", None),
        ];
        for (key, expected) in rows {
            assert_eq!(key.parse::<TaskKey>().ok().and_then(parse_key), expected, "{key}");
        }
        assert_eq!(parse_key(summary_key(7)), Some((7, false)));
        assert_eq!(summary_key(7).to_string(), "c7-summary");
        assert_eq!(parse_key(fallback_key(7)), Some((7, true)));
        assert_eq!(fallback_key(7).to_string(), "c7-summary-fallback");
    }

    #[test]
    fn pinned_users_the_tail_and_unresolved_calls_survive() {
        let system = ChatMessage::System { content: "be brief".into() };
        let transcript = vec![
            system.clone(),
            user("the input: never touch prod"),
            assistant(&["a"]),
            result("a"),
            ChatMessage::Assistant { content: Some("first answer".into()), tool_calls: vec![] },
            user("feedback: also check staging"),
            assistant(&["b"]),
            result("b"),
            assistant(&["c", "d"]),
            result("c"),
            result("d"),
        ];
        let plan = plan(&transcript).expect("something to compact");
        assert_eq!(plan.tail_start, 8, "the latest round is the retained tail");
        assert_eq!(plan.compacted, [2, 3, 4, 6, 7]);
        let out = compacted_transcript(&transcript, &plan, "did a and b");
        assert_eq!(out[0], system);
        assert_eq!(out[1], user("the input: never touch prod"));
        assert_eq!(out[2], user("feedback: also check staging"));
        assert_eq!(
            out[3],
            ChatMessage::Assistant {
                content: Some(format!(
                    "{SUMMARY_HEADER}

did a and b"
                )),
                tool_calls: vec![]
            }
        );
        assert_eq!(&out[4..], &transcript[8..]);

        // A call whose result has not reached the model keeps its message and everything after.
        let open = vec![user("go"), assistant(&["a"]), result("a"), assistant(&["b"]), assistant(&["c"]), result("c")];
        let plan_open = super::plan(&open).expect("a is compactable");
        assert_eq!((plan_open.tail_start, plan_open.compacted.clone()), (3, vec![1, 2]));

        // An earlier summary is compacted again; users and the tail are all there is otherwise.
        let again = compacted_transcript(&transcript, &plan, "s1");
        let mut next = again.clone();
        next.extend([assistant(&["e"]), result("e")]);
        let plan_next = super::plan(&next).expect("the old summary and round c are compactable");
        assert!(plan_next.compacted.contains(&3), "the earlier summary is history now");
        assert_eq!(super::plan(&[user("a"), assistant(&["x"]), result("x")]), None, "only the tail");
        assert_eq!(super::plan(&[user("a"), user("b")]), None, "only pinned messages");
        assert_eq!(super::plan(&[]), None);
    }

    #[test]
    fn the_delegate_input_fits_its_bound_oldest_first() {
        let run = ExecutionId::new_v4();
        let big = |id: &str| ChatMessage::Tool { tool_call_id: id.into(), content: "x".repeat(40_000) };
        let transcript =
            vec![user("u"), assistant(&["a"]), big("a"), assistant(&["b"]), big("b"), assistant(&["c"]), result("c")];
        let plan = plan(&transcript).expect("plan");
        let whole = delegate_input(&transcript, &plan, run, "r4", usize::MAX);
        assert_eq!(whole["history"].as_array().map(Vec::len), Some(5));
        assert_eq!(whole["retained_tail"].as_array().map(Vec::len), Some(2));
        assert_eq!((whole["task"].as_str(), whole["run_public_id"].clone()), (Some("r4"), json!(run)));
        let bounded = delegate_input(&transcript, &plan, run, "r4", DELEGATE_INPUT_BOUND);
        assert!(bounded.to_string().len() <= DELEGATE_INPUT_BOUND, "{}", bounded.to_string().len());
        let history = bounded["history"].as_array().expect("history");
        assert_eq!(history.len(), 2, "the oldest material went first: {history:?}");
        assert_eq!(history[0]["role"], "assistant");
        assert_eq!(history[1]["tool_call_id"], "b");
        assert_eq!(bounded["retained_tail"], whole["retained_tail"], "the tail is kept while history can go");
        let tiny = delegate_input(&transcript, &plan, run, "r4", 200);
        assert!(tiny.to_string().len() <= 200);
        assert_eq!(tiny["history"], json!([]));
    }

    #[test]
    fn the_summarizer_input_trims_the_oldest_messages() {
        let transcript = vec![user("first"), assistant(&["a"]), result("a"), assistant(&["b"]), result("b")];
        let plan = plan(&transcript).expect("plan");
        let whole = summarizer_input(&transcript, &plan, usize::MAX);
        assert!(whole.contains("[user, kept verbatim] first"));
        assert!(whole.contains("[assistant called bash as a] {}"));
        assert!(whole.contains("[result of a] result a"));
        assert!(!whole.contains("result b"), "the tail is not summarized");
        let bounded = summarizer_input(&transcript, &plan, 80);
        assert!(bounded.contains("trimmed"), "{bounded}");
        assert!(bounded.contains("[result of a]"), "the newest is kept: {bounded}");
        assert!(!bounded.contains("first"), "the oldest went first: {bounded}");
    }

    #[test]
    fn r70_policies_enable_kernel_and_delegate_only() {
        let declaration = |policy: Value| {
            let configuration = json!({"compaction_policy": policy, "default_model": "scripted/default"});
            let selection = crate::declaration::tools::RunnerSelection::FirstEligible;
            crate::declaration::freeze(&configuration, None, selection, &[], None).expect("frozen")
        };
        assert_eq!(policy(&declaration(Value::Null)), None);
        assert_eq!(policy(&declaration(json!({"mode": "off"}))), None);
        assert_eq!(
            policy(&declaration(json!({"mode": "kernel", "model": "p/m"}))),
            Some(Policy { mode: CompactionMode::Kernel, tool_name: None, model: Some("p/m".into()) })
        );
        assert_eq!(
            policy(&declaration(json!({"mode": "delegate", "tool_name": "summarize"}))),
            Some(Policy { mode: CompactionMode::Delegate, tool_name: Some("summarize".into()), model: None })
        );
        let frozen = declaration(json!({"mode": "kernel"}));
        let digest = frozen.digest.clone();
        let with = frozen.with_summarizer(Some(json!({"content": "keep pointers", "role": "system"})));
        assert_ne!(with.digest, digest, "the summarizer is part of the frozen declaration");
    }

    #[test]
    fn the_byte_bound_then_the_usage_threshold_then_the_estimate_decide() {
        let measure = Measure {
            request_bytes: 1_000,
            request_bytes_bound: 10_000,
            last_round_tokens: None,
            tail_bytes: 0,
            window_tokens: 1_000,
            threshold_percent: 80,
        };
        assert_eq!(trigger(&measure), None, "250 estimated tokens fit a 1,000 token window");
        // Over the byte bound: `wall`, however few tokens the provider counted.
        let wall = Measure { request_bytes: 10_500, last_round_tokens: Some(1), ..measure };
        assert_eq!(
            trigger(&wall),
            Some(Detected { trigger: CompactionTrigger::Wall, overshoot_bytes: Some(500), overshoot_tokens: None })
        );
        // The provider's count and the tail's estimate against 80 % of the window.
        let usage = Measure { last_round_tokens: Some(790), tail_bytes: 80, ..measure };
        assert_eq!(
            trigger(&usage),
            Some(Detected { trigger: CompactionTrigger::Usage, overshoot_bytes: None, overshoot_tokens: Some(10) })
        );
        assert_eq!(trigger(&Measure { tail_bytes: 40, ..usage }), None, "800 tokens is the threshold itself");
        // No count yet: the whole request's estimate against the window.
        let estimate = Measure { request_bytes: 4_004, ..measure };
        assert_eq!(
            trigger(&estimate),
            Some(Detected { trigger: CompactionTrigger::Wall, overshoot_bytes: None, overshoot_tokens: Some(1) })
        );
        assert_eq!(trigger(&Measure { request_bytes: 4_000, ..measure }), None);
        // Saturating arithmetic: no overflow at the extremes.
        let huge =
            Measure { window_tokens: u64::MAX, threshold_percent: 100, last_round_tokens: Some(u64::MAX), ..measure };
        assert_eq!(trigger(&huge).map(|d| d.trigger), Some(CompactionTrigger::Usage));
        assert_eq!(trigger(&Measure { last_round_tokens: Some(u64::MAX / 200), ..huge }), None);
        assert_eq!(summarizer_bound(1_000, 80), 3_200, "80 % of 4,000 bytes");
        assert_eq!(summarizer_bound(u64::MAX, 100), usize::try_from(u64::MAX / 100).expect("64-bit"), "saturates");
    }
}
