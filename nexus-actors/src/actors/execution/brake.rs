//! The repeat brake, the round driver's only ceiling (`docs/executions.md`, "Repeat brake").
//!
//! - A round is *stale* when every call-and-result it carries was already seen in the previous
//!   [`STALE_LOOKBACK`] rounds and nothing new reached the model (no user message since).
//! - When the last [`STALE_RUN`] rounds are all stale, expanding another round is refused:
//!   `round_expansion_refused` / `repeat_call_loop`.
//! - So a single call whose result does not change is refused at its [`SINGLE_CALL_LIMIT`]th
//!   round: its 2nd to 9th rounds are the stale run.
//! - The brake looks back at most [`WINDOW`] rounds.
//! - A round made only of `read_process` polls is exempt: polling a long process is progress.
//!
//! The brake reads only the transcript, so it needs no state of its own and gives the same answer
//! after a restart.

use std::collections::HashMap;

use serde_json::Value;

use crate::model::{ChatMessage, ToolCall};

/// Rounds before a round in which its calls and results are looked for.
pub const STALE_LOOKBACK: usize = 16;
/// Consecutive stale rounds after which the next expansion is refused.
pub const STALE_RUN: usize = 8;
/// The round at which one unchanging call is refused.
pub const SINGLE_CALL_LIMIT: usize = 10;
/// The most rounds the brake reads back.
pub const WINDOW: usize = 24;
/// The served name whose rounds are exempt.
pub const POLL_TOOL: &str = "read_process";

/// One call and the result it got: `(name, canonical arguments, result text)`.
type Pair = (String, String, String);

#[derive(Debug)]
struct Round {
    pairs: Vec<Pair>,
    /// A user message (new input, steering, hook feedback) reached the model before this round.
    fresh: bool,
}

impl Round {
    fn polls_only(&self) -> bool {
        !self.pairs.is_empty() && self.pairs.iter().all(|(name, _, _)| name == POLL_TOOL)
    }
}

/// Arguments with their keys sorted, so that `{"a":1,"b":2}` and `{"b":2,"a":1}` are one call.
fn canonical(arguments: &str) -> String {
    serde_json::from_str::<Value>(arguments).map_or_else(|_| arguments.trim().to_owned(), |v| v.to_string())
}

/// The completed tool rounds of a transcript, oldest first.
fn rounds(transcript: &[ChatMessage]) -> Vec<Round> {
    let mut results: HashMap<&str, &str> = HashMap::new();
    for message in transcript {
        if let ChatMessage::Tool { tool_call_id, content } = message {
            results.insert(tool_call_id, content);
        }
    }
    let mut rounds = Vec::new();
    let mut fresh = false;
    let mut seen_assistant = false;
    for message in transcript {
        match message {
            ChatMessage::User { .. } if seen_assistant => fresh = true,
            ChatMessage::Assistant { tool_calls, .. } if !tool_calls.is_empty() => {
                seen_assistant = true;
                let pairs = tool_calls
                    .iter()
                    .map(|c| {
                        let result = results.get(c.id.as_str()).copied().unwrap_or_default();
                        (c.name.clone(), canonical(&c.arguments), result.to_owned())
                    })
                    .collect();
                rounds.push(Round { pairs, fresh });
                fresh = false;
            }
            ChatMessage::Assistant { .. } => seen_assistant = true,
            _ => {}
        }
    }
    rounds
}

/// Why a new round is refused: `repeat_call_loop` with a message for the person who reads it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refused {
    /// The detail word, `repeat_call_loop`.
    pub detail: &'static str,
    /// What was seen.
    pub message: String,
}

/// Judges the round the model asks for (`next`) against the completed rounds of `transcript`.
/// `None` lets it expand.
pub fn check(transcript: &[ChatMessage], next: &[ToolCall]) -> Option<Refused> {
    let all = rounds(transcript);
    let window = &all[all.len().saturating_sub(WINDOW)..];
    let next_polls_only = !next.is_empty() && next.iter().all(|c| c.name == POLL_TOOL);

    // The last rounds all stale.
    if window.len() < STALE_RUN || next_polls_only {
        return None;
    }
    let stale = |index: usize| {
        let round = &window[index];
        if round.fresh || round.polls_only() {
            return false;
        }
        let earlier = &window[index.saturating_sub(STALE_LOOKBACK)..index];
        round.pairs.iter().all(|pair| earlier.iter().any(|r| r.pairs.contains(pair)))
    };
    let last = window.len();
    if (last - STALE_RUN..last).all(stale) {
        return Some(Refused {
            detail: "repeat_call_loop",
            message: format!("the last {STALE_RUN} rounds only repeated calls and results already seen"),
        });
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(id: &str, name: &str, arguments: &str) -> ToolCall {
        ToolCall { id: id.into(), name: name.into(), arguments: arguments.into(), model_id: None }
    }

    /// A transcript of rounds, each `[(name, arguments, result)]`.
    fn transcript(rounds: &[Vec<(&str, &str, &str)>]) -> Vec<ChatMessage> {
        let mut messages = vec![ChatMessage::User { content: "go".into() }];
        for (r, round) in rounds.iter().enumerate() {
            let calls: Vec<ToolCall> =
                round.iter().enumerate().map(|(i, (n, a, _))| call(&format!("r{r}c{i}"), n, a)).collect();
            messages.push(ChatMessage::Assistant { content: None, tool_calls: calls.clone() });
            for (c, (_, _, result)) in calls.iter().zip(round) {
                messages.push(ChatMessage::Tool { tool_call_id: c.id.clone(), content: (*result).to_owned() });
            }
        }
        messages
    }

    #[test]
    fn one_unchanging_call_is_refused_at_its_tenth_round() {
        let same = vec![("bash", r#"{"command":"ls"}"#, "a.txt")];
        let nine = transcript(&vec![same.clone(); 9]);
        let refused = check(&nine, &[call("x", "bash", r#"{ "command": "ls" }"#)]).expect("refused");
        assert_eq!(refused.detail, "repeat_call_loop");
        assert_eq!(nine.iter().filter(|m| matches!(m, ChatMessage::Assistant { .. })).count(), SINGLE_CALL_LIMIT - 1);
        let eight = transcript(&vec![same.clone(); 8]);
        assert_eq!(check(&eight, &[call("x", "bash", r#"{"command":"ls"}"#)]), None, "the 9th round still runs");
        // A changed result, or another input, resets the count.
        let mut changing = vec![same.clone(); 8];
        changing.push(vec![("bash", r#"{"command":"ls"}"#, "a.txt b.txt")]);
        assert_eq!(check(&transcript(&changing), &[call("x", "bash", r#"{"command":"ls"}"#)]), None);
        // Whatever comes next: the stale run is behind it.
        assert!(check(&nine, &[call("x", "bash", r#"{"command":"ls -a"}"#)]).is_some());
        assert_eq!(check(&eight, &[call("x", "bash", r#"{"command":"ls -a"}"#)]), None);
    }

    #[test]
    fn eight_stale_rounds_are_refused_and_fresh_input_or_news_are_not() {
        let a = ("read_file", r#"{"path":"a"}"#, "A");
        let b = ("read_file", r#"{"path":"b"}"#, "B");
        // Two new rounds, then eight that only repeat them.
        let mut rounds = vec![vec![a], vec![b]];
        rounds.extend((0..8).map(|i| if i % 2 == 0 { vec![a, b] } else { vec![b] }));
        let next = [call("n", "read_file", r#"{"path":"a"}"#), call("m", "read_file", r#"{"path":"c"}"#)];
        let refused = check(&transcript(&rounds), &next).expect("refused");
        assert!(refused.message.contains("8 rounds"), "{}", refused.message);
        // Seven stale rounds are not enough.
        assert_eq!(check(&transcript(&rounds[..9]), &next), None);
        // A round with a new result in the run breaks it.
        let mut news = rounds.clone();
        news[6] = vec![("read_file", r#"{"path":"c"}"#, "C")];
        assert_eq!(check(&transcript(&news), &next), None);
        // So does a user message that reached the model.
        let mut steered = transcript(&rounds);
        let at = steered.len() - 4;
        steered.insert(at, ChatMessage::User { content: "try something else".into() });
        assert_eq!(check(&steered, &next), None);
    }

    #[test]
    fn polls_are_exempt_and_the_window_is_bounded() {
        let poll = vec![("read_process", r#"{"id":1}"#, "running")];
        let polls = transcript(&vec![poll; 30]);
        assert_eq!(check(&polls, &[call("p", "read_process", r#"{"id":1}"#)]), None);
        // Repeats older than the window are not counted against a round inside it.
        let mut rounds: Vec<Vec<(&str, &str, &str)>> = vec![vec![("bash", r#"{"command":"ls"}"#, "x")]; 3];
        let distinct: Vec<String> = (0..WINDOW).map(|i| format!(r#"{{"command":"echo {i}"}}"#)).collect();
        rounds.extend(distinct.iter().map(|a| vec![("bash", a.as_str(), "ok")]));
        assert_eq!(check(&transcript(&rounds), &[call("n", "bash", r#"{"command":"ls"}"#)]), None);
    }
}
