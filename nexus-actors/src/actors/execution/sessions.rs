//! The history kernel tools `session_search` and `session_read` (`docs/kernel-tools.md`,
//! "session_search and session_read"; REFERENCE 5, R37): they read the turns of the conversations
//! the execution's frozen `conversation_reach` reaches, through [`crate::store::Reachable`].
//!
//! - `workspace` (and null): every conversation of the answering Agent.
//! - `subtree`: the current conversation and its descendants. Conversations have no parent yet,
//!   so the subtree is the current conversation alone; [`reachable`] answers it as a set of ids,
//!   which is where descendants join it.
//!
//! No reach ever shows another Agent's conversation, and an id outside the reach reads exactly as
//! an id that does not exist (`unknown_conversation`). Bad input is a call error envelope whose
//! message starts with its word ([`Refused`]); nothing is read for it.

use std::fmt::Display;

use serde_json::{Map, Value, json};

use nexus_proto::{ConversationId, InputId};

use crate::declaration::memory::ConversationReach;
use crate::store::{Reachable, SESSION_TEXT_CUT, Store, StoreResult, TurnCursor, TurnText};

use super::kernel::KernelCall;

/// `session_search`'s `query` bound, in bytes.
pub const QUERY_BYTES: usize = 1024;
/// `limit`'s largest value, for both tools.
pub const LIMIT_MAX: u64 = 50;
/// `session_search`'s default `limit`.
pub const SEARCH_LIMIT_DEFAULT: u64 = 10;
/// `session_read`'s default `limit`.
pub const READ_LIMIT_DEFAULT: u64 = 20;
/// The most characters of input and answer text one `session_read` page carries in all.
pub const READ_CHARS: i64 = SESSION_TEXT_CUT;
/// A search hit's snippet: at most this many characters of the matching text...
pub const SNIPPET_CHARS: usize = 300;
/// ...starting this many characters before the match when there are that many.
const SNIPPET_LEAD: usize = 100;

/// Why a history tool refused its input: the word its call error envelope starts with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refused {
    /// A required parameter is absent or empty.
    ParameterMissing,
    /// A parameter is of the wrong type, out of bounds or unknown.
    ParameterInvalid,
    /// `query` is over [`QUERY_BYTES`].
    QueryTooLong,
    /// `session_id` names no conversation this execution reaches (or none at all).
    UnknownConversation,
}

impl Refused {
    /// The word.
    #[must_use]
    pub fn word(self) -> &'static str {
        match self {
            Refused::ParameterMissing => "parameter_missing",
            Refused::ParameterInvalid => "parameter_invalid",
            Refused::QueryTooLong => "query_too_long",
            Refused::UnknownConversation => "unknown_conversation",
        }
    }

    fn say(self, message: impl Display) -> String {
        format!("{}: {message}", self.word())
    }
}

/// What a tool answers the model: a result, or a call error envelope's message.
pub type Answer = Result<Value, String>;

/// The most descendant conversations a `subtree` reach covers beside the current one; deeper or
/// wider trees are cut there, breadth first (`docs/delegation.md`).
pub const SUBTREE_BOUND: usize = 1_000;

/// The conversations `call` reaches under its frozen `conversation_reach`: every one of the
/// Agent's (`workspace`), or the current conversation and its descendants, the child
/// conversations delegation started (`subtree`, R37).
///
/// # Errors
/// A store failure.
pub async fn reachable(call: &KernelCall) -> Result<Reachable, crate::store::StoreError> {
    let within = match call.declaration.conversation_reach {
        ConversationReach::Workspace => None,
        ConversationReach::Subtree => {
            let mut within = vec![call.conversation];
            within.extend(call.fabric.store.descendant_conversations(call.conversation, SUBTREE_BOUND).await?);
            Some(within)
        }
    };
    Ok(Reachable { agent: call.agent, within })
}

/// The object of `input`, refusing a parameter outside `known`.
fn parameters<'a>(tool: &str, input: &'a Value, known: &[&str]) -> Result<&'a Map<String, Value>, String> {
    let Some(object) = input.as_object() else {
        return Err(Refused::ParameterInvalid.say(format!("{tool} takes an object of parameters")));
    };
    if let Some(unknown) = object.keys().find(|k| !known.contains(&k.as_str())) {
        return Err(
            Refused::ParameterInvalid.say(format!("{tool} has no parameter {unknown}; it takes {}", known.join(", ")))
        );
    }
    Ok(object)
}

/// `limit`: absent or null is `default`, else an integer from 1 to [`LIMIT_MAX`].
fn limit(object: &Map<String, Value>, default: u64) -> Result<i64, String> {
    let limit = match object.get("limit") {
        None | Some(Value::Null) => default,
        Some(value) => value
            .as_u64()
            .filter(|l| (1..=LIMIT_MAX).contains(l))
            .ok_or_else(|| Refused::ParameterInvalid.say(format!("limit must be an integer from 1 to {LIMIT_MAX}")))?,
    };
    Ok(i64::try_from(limit).unwrap_or(1))
}

/// An optional string parameter.
fn text<'a>(object: &'a Map<String, Value>, name: &str) -> Result<Option<&'a str>, String> {
    match object.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(text)) => Ok(Some(text)),
        Some(_) => Err(Refused::ParameterInvalid.say(format!("{name} must be a string"))),
    }
}

/// An optional position: an integer ≥ 0.
fn position(object: &Map<String, Value>, name: &str) -> Result<Option<i64>, String> {
    match object.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(value) => value
            .as_u64()
            .and_then(|p| i64::try_from(p).ok())
            .map(Some)
            .ok_or_else(|| Refused::ParameterInvalid.say(format!("{name} must be an integer of 0 or more"))),
    }
}

/// A search page's cursor: `<created_at>.<input id>` of its last hit.
fn cursor_text(turn: &TurnText) -> String {
    format!("{}.{}", turn.created_at, turn.input_public_id)
}

fn parse_cursor(text: &str) -> Option<TurnCursor> {
    let (created_at, input) = text.split_once('.')?;
    Some(TurnCursor { created_at: created_at.parse().ok()?, input_public_id: input.parse().ok()? })
}

/// `session_search` (`docs/kernel-tools.md`): the reachable turns whose input text or answer
/// contains `query` (ASCII letters without regard to case), newest first, leaving out the
/// calling turn `current`. Answers `{results: [{session_id, turn_id, position, created_at,
/// matched: input|answer, snippet}], next}`, `next` being the `after` of the following page or
/// null.
///
/// # Errors
/// The store's failures; refused input is an `Ok(Err(message))`.
pub async fn search(store: &Store, reach: &Reachable, current: InputId, input: &Value) -> StoreResult<Answer> {
    let parsed = (|| {
        let object =
            parameters("session_search", input, &["query", "archived", "include_auxiliary", "limit", "after"])?;
        let query = text(object, "query")?.filter(|q| !q.trim().is_empty()).ok_or_else(|| {
            Refused::ParameterMissing.say("query is required: the words to search past conversations for")
        })?;
        if query.len() > QUERY_BYTES {
            return Err(Refused::QueryTooLong
                .say(format!("query is {} bytes; at most {QUERY_BYTES}: search for fewer words", query.len())));
        }
        let archived = match text(object, "archived")? {
            None | Some("exclude" | "include") => false,
            Some("only") => true,
            Some(_) => return Err(Refused::ParameterInvalid.say("archived must be exclude, include or only")),
        };
        match object.get("include_auxiliary") {
            None | Some(Value::Null | Value::Bool(_)) => {}
            Some(_) => return Err(Refused::ParameterInvalid.say("include_auxiliary must be true or false")),
        }
        let limit = limit(object, SEARCH_LIMIT_DEFAULT)?;
        let after = match text(object, "after")? {
            None => None,
            Some(after) => Some(parse_cursor(after).ok_or_else(|| {
                Refused::ParameterInvalid.say("after must be the next cursor a session_search answered")
            })?),
        };
        Ok((query.to_owned(), archived, limit, after))
    })();
    let (query, archived_only, limit, after) = match parsed {
        Ok(parsed) => parsed,
        Err(message) => return Ok(Err(message)),
    };
    // No conversation is ever archived here: `only` finds none.
    if archived_only {
        return Ok(Ok(json!({"results": [], "next": null})));
    }
    let mut hits = store.search_turns(reach, &query, current, after.as_ref(), limit + 1).await?;
    let more = hits.len() > usize::try_from(limit).unwrap_or(usize::MAX);
    hits.truncate(usize::try_from(limit).unwrap_or(usize::MAX));
    let needle = query.to_lowercase();
    let results: Vec<Value> = hits
        .iter()
        .map(|hit| {
            let (matched, snippet) = match (find_folded(&hit.text, &needle), hit.answer.as_deref()) {
                (Some(at), _) => ("input", snippet(&hit.text, at)),
                (None, Some(answer)) => match find_folded(answer, &needle) {
                    Some(at) => ("answer", snippet(answer, at)),
                    None => ("input", snippet(&hit.text, 0)),
                },
                (None, None) => ("input", snippet(&hit.text, 0)),
            };
            json!({
                "session_id": hit.conversation_public_id,
                "turn_id": hit.input_public_id,
                "position": hit.turn,
                "created_at": hit.created_at,
                "matched": matched,
                "snippet": snippet,
            })
        })
        .collect();
    let next = if more { hits.last().map(cursor_text) } else { None };
    Ok(Ok(json!({"results": results, "next": next})))
}

/// The character index in `text` where `needle` (already lowercased) starts, compared with
/// `text` lowercased.
fn find_folded(text: &str, needle: &str) -> Option<usize> {
    let mut lower = String::with_capacity(text.len());
    let mut owner: Vec<usize> = Vec::with_capacity(text.len());
    for (index, c) in text.chars().enumerate() {
        for folded in c.to_lowercase() {
            let before = lower.len();
            lower.push(folded);
            owner.resize(lower.len(), index);
            debug_assert!(owner.len() > before);
        }
    }
    lower.find(needle).map(|at| owner[at])
}

/// At most [`SNIPPET_CHARS`] characters of `text` around the character `at`, `…` marking text
/// left out at either end.
fn snippet(text: &str, at: usize) -> String {
    let start = at.saturating_sub(SNIPPET_LEAD);
    let mut shown: String = text.chars().skip(start).take(SNIPPET_CHARS).collect();
    if text.chars().nth(start + SNIPPET_CHARS).is_some() {
        shown.push('…');
    }
    if start > 0 { format!("…{shown}") } else { shown }
}

/// `session_read` (`docs/kernel-tools.md`): one reachable conversation's turns in order, paged:
/// from the start, after `after_position`, before `before_position` (the newest before it), both
/// (between them), or a window centered on `around_turn_id`; at most `limit` turns and
/// [`READ_CHARS`] characters of text in all. Answers `{session_id, turn_count, turns: [{position,
/// turn_id, input, answer, status, cut?, input_chars?, answer_chars?}], next_after_position,
/// previous_before_position}`; a turn longer than the page's room is cut, says `cut: true` and
/// gives its full lengths (it comes only first on a page).
///
/// # Errors
/// The store's failures; refused input is an `Ok(Err(message))`.
pub async fn read(store: &Store, reach: &Reachable, input: &Value) -> StoreResult<Answer> {
    let parsed = (|| {
        let object = parameters(
            "session_read",
            input,
            &["session_id", "around_turn_id", "after_position", "before_position", "limit"],
        )?;
        let session = text(object, "session_id")?
            .filter(|s| !s.trim().is_empty())
            .ok_or_else(|| Refused::ParameterMissing.say("session_id is required: a session_id session_search found"))?
            .to_owned();
        let around =
            match text(object, "around_turn_id")? {
                None => None,
                Some(turn) => Some(turn.parse::<InputId>().map_err(|_| {
                    Refused::ParameterInvalid.say("around_turn_id must be a turn_id of this conversation")
                })?),
            };
        let after = position(object, "after_position")?;
        let before = position(object, "before_position")?;
        if around.is_some() && (after.is_some() || before.is_some()) {
            return Err(Refused::ParameterInvalid
                .say("around_turn_id centers the page itself: give it without after_position and before_position"));
        }
        Ok((session, around, after, before, limit(object, READ_LIMIT_DEFAULT)?))
    })();
    let (session, around, after, before, limit) = match parsed {
        Ok(parsed) => parsed,
        Err(message) => return Ok(Err(message)),
    };
    let unknown = || {
        Refused::UnknownConversation
            .say(format!("no conversation {session} is reachable from here; find one with session_search"))
    };
    let Ok(conversation) = session.parse::<ConversationId>() else { return Ok(Err(unknown())) };
    if !store.conversation_reachable(reach, conversation).await? {
        return Ok(Err(unknown()));
    }
    let turns = match (around, after, before) {
        (Some(turn_id), _, _) => {
            let Some(turn) = store.turn_of(conversation, turn_id).await? else {
                return Ok(Err(Refused::ParameterInvalid
                    .say(format!("around_turn_id {turn_id} is not a turn of conversation {conversation}"))));
            };
            let from = (turn - 1 - (limit - 1) / 2).max(0);
            store.turn_range(conversation, from, None, false, limit).await?
        }
        (None, after, Some(before)) => {
            store.turn_range(conversation, after.unwrap_or(0), Some(before), after.is_none(), limit).await?
        }
        (None, after, None) => store.turn_range(conversation, after.unwrap_or(0), None, false, limit).await?,
    };
    let backward = around.is_none() && after.is_none() && before.is_some();
    let shown = within_budget(turns, backward);
    let count = store.turn_count(conversation).await?;
    let first = shown.first().map(|(turn, _)| turn.turn);
    let last = shown.last().map(|(turn, _)| turn.turn);
    let turns: Vec<Value> = shown.iter().map(|(turn, room)| turn_json(turn, *room)).collect();
    Ok(Ok(json!({
        "session_id": conversation,
        "turn_count": count,
        "turns": turns,
        "next_after_position": last.filter(|last| *last < count),
        "previous_before_position": first.filter(|first| *first > 1),
    })))
}

/// The turns a page shows under [`READ_CHARS`], each with the characters it may show (`None`:
/// all of it). Whole turns are kept while they fit, from the front (or with `backward` from the
/// back); the first that does not fit is cut to the room left when it would be the page's only
/// turn, else the page ends before it.
fn within_budget(turns: Vec<TurnText>, backward: bool) -> Vec<(TurnText, Option<i64>)> {
    let mut order = turns;
    if backward {
        order.reverse();
    }
    let mut room = READ_CHARS;
    let mut shown = Vec::new();
    for turn in order {
        let size = turn.text_chars + turn.answer_chars;
        if size <= room {
            room -= size;
            shown.push((turn, None));
            continue;
        }
        if shown.is_empty() {
            shown.push((turn, Some(room)));
        }
        break;
    }
    if backward {
        shown.reverse();
    }
    shown
}

fn take_chars(text: &str, count: i64) -> String {
    text.chars().take(usize::try_from(count.max(0)).unwrap_or(0)).collect()
}

fn turn_json(turn: &TurnText, room: Option<i64>) -> Value {
    let mut value = json!({
        "position": turn.turn,
        "turn_id": turn.input_public_id,
        "input": turn.text,
        "answer": turn.answer,
        "status": turn.status.map(|s| s.to_string()),
    });
    if let Some(room) = room {
        let input_room = room.min(turn.text_chars);
        value["input"] = json!(take_chars(&turn.text, input_room));
        value["answer"] = json!(turn.answer.as_deref().map(|a| take_chars(a, room - input_room)));
        value["cut"] = json!(true);
        value["input_chars"] = json!(turn.text_chars);
        value["answer_chars"] = json!(turn.answer_chars);
    }
    value
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_snippet_surrounds_the_match_and_marks_what_it_leaves_out() {
        let text = format!("{}Zebra{}", "a".repeat(150), "b".repeat(400));
        let at = find_folded(&text, "zebra").expect("found");
        assert_eq!(at, 150);
        let cut = snippet(&text, at);
        assert!(cut.starts_with('…') && cut.ends_with('…'), "{cut}");
        assert_eq!(cut.chars().count(), SNIPPET_CHARS + 2);
        assert!(cut.contains("Zebra"));
        assert_eq!(snippet("short zebra", 6), "short zebra");
        // Folding that changes byte lengths keeps character positions.
        assert_eq!(find_folded("İİ zebra", "zebra"), Some(3));
    }

    #[test]
    fn cursors_round_trip_and_refuse_anything_else() {
        let turn = TurnText {
            conversation_public_id: ConversationId::new_v4(),
            input_public_id: InputId::new_v4(),
            turn: 3,
            created_at: 1_700_000_000_000,
            text: String::new(),
            text_chars: 0,
            status: None,
            answer: None,
            answer_chars: 0,
        };
        let cursor = parse_cursor(&cursor_text(&turn)).expect("parses");
        assert_eq!((cursor.created_at, cursor.input_public_id), (turn.created_at, turn.input_public_id));
        assert!(parse_cursor("yesterday").is_none());
        assert!(parse_cursor("12.not-a-uuid").is_none());
    }
}
