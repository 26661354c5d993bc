//! History you can read (`docs/executions.md`, "History"): the caller's conversations, one
//! conversation's turns, and the caller's executions, each a bounded page. The HTTP doors
//! (`GET /agent_api/v1/conversations`, `GET /agent_api/v1/conversations/{id}`,
//! `GET /agent_api/v1/executions`) and their gRPC twins (`ListConversations`, `GetConversation`,
//! `ListExecutions`) call these functions, so both transports page, filter and refuse alike.
//!
//! Whose history a caller reads is decided in one place, [`readable_agents`]: every listing and
//! every read of one conversation filters through it.

use serde_json::{Value, json};

use nexus_proto::{ConversationId, ErrorCode, ExecutionId, MemberId, Refusal, RunStatus};

use super::{Api, Caller, internal, preview};
use crate::store::{ConversationSummary, ExecutionFilter, ExecutionSummary, Keyset, TurnRow};

/// The page size of the listings when `limit` is absent (as the event pages).
pub const LISTING_DEFAULT_LIMIT: u64 = 100;
/// The largest page of the listings (as the event pages).
pub const LISTING_MAX_LIMIT: u64 = 200;
/// The most turns one conversation reply carries.
pub const TURN_PAGE_MAX: usize = 200;
/// The most bytes of turn JSON one conversation reply carries (3 MiB; at least one turn): with
/// the envelope, a reply fits [`crate::AGENT_REPLY_BOUND`].
pub const TURN_PAGE_BOUND: usize = 3 * 1024 * 1024;
/// The most bytes a preview of an input text holds when its turn alone would not fit
/// [`TURN_PAGE_BOUND`] (a 1 MiB text whose JSON escapes grow it past the bound).
pub const TURN_TEXT_PREVIEW: usize = 65_536;
/// Turns read from the store per query while a page fills: a page holds what fits, and memory
/// holds at most this many turns beyond it.
const TURN_CHUNK: i64 = 8;

/// The Agents whose conversations and executions `caller` may read: an Agent reads its own; a
/// Human reads those it stewards or views ([`super::standing::agents_readable_by`]). Every history
/// door filters through this one function, so the standing rule changes what all of them show at
/// once.
///
/// # Errors
/// `internal` on a store failure.
pub async fn readable_agents(api: &Api, caller: &Caller) -> Result<Vec<MemberId>, Refusal> {
    super::standing::agents_readable_by(&api.fabric.store, &caller.member).await
}

/// A listing's `limit`: 1 to [`LISTING_MAX_LIMIT`], [`LISTING_DEFAULT_LIMIT`] when absent.
///
/// # Errors
/// 400 `parameter_invalid` outside the bounds.
pub fn listing_limit(limit: Option<u64>) -> Result<i64, Refusal> {
    let limit = limit.unwrap_or(LISTING_DEFAULT_LIMIT);
    if !(1..=LISTING_MAX_LIMIT).contains(&limit) {
        return Err(limit_refusal());
    }
    i64::try_from(limit).map_err(|_| limit_refusal())
}

/// A listing's `limit` as query text ([`listing_limit`]); anything but a decimal integer is
/// refused with the same word and message.
///
/// # Errors
/// 400 `parameter_invalid`.
pub fn listing_limit_text(limit: Option<&str>) -> Result<i64, Refusal> {
    let parsed = limit.map(|text| text.parse::<u64>().map_err(|_| limit_refusal())).transpose()?;
    listing_limit(parsed)
}

fn limit_refusal() -> Refusal {
    Refusal::new(ErrorCode::ParameterInvalid, format!("limit must be an integer from 1 to {LISTING_MAX_LIMIT}"))
}

/// A run status word of the `status` filter.
///
/// # Errors
/// 400 `parameter_invalid` naming the words.
pub fn status_filter(status: &str) -> Result<RunStatus, Refusal> {
    status.parse().map_err(|_| {
        let words: Vec<&str> = RunStatus::ALL.iter().map(|s| s.as_str()).collect();
        Refusal::new(
            ErrorCode::ParameterInvalid,
            format!("status {} is not a run status; use one of {}", crate::json::echo(status), words.join(", ")),
        )
    })
}

fn uuid_refusal(name: &str) -> Refusal {
    Refusal::new(ErrorCode::ParameterInvalid, format!("{name} must be a UUID (lower-case, hyphenated)"))
}

fn stale_cursor(what: &str) -> Refusal {
    Refusal::new(
        ErrorCode::ParameterInvalid,
        format!("after names no {what} you can read; pass the next_cursor of an earlier page"),
    )
}

fn missing_conversation(id: ConversationId) -> Refusal {
    Refusal::new(ErrorCode::NotFound, format!("no conversation {id}"))
}

fn conversation_json(row: &ConversationSummary) -> Value {
    json!({
        "conversation_public_id": row.public_id,
        "member_public_id": row.member_public_id,
        "created_at": row.created_at,
        "turn_count": row.turns,
        "last_turn_at": row.last_turn_at,
        "last_execution_public_id": row.last_execution_public_id,
        "last_status": row.last_status,
    })
}

/// A turn as `GET /agent_api/v1/conversations/{id}` shows it (`docs/executions.md`, "History").
/// A turn whose JSON alone is over [`TURN_PAGE_BOUND`] shows a preview of its text, with
/// `text_truncated` true.
fn turn_json(row: &TurnRow) -> Value {
    let view = |text: &str, truncated: bool| {
        json!({
            "turn": row.turn,
            "input_public_id": row.input_public_id,
            "text": text,
            "text_truncated": truncated,
            "posted_by_public_id": row.posted_by_public_id,
            "execution_public_id": row.execution_public_id,
            "status": row.status,
            "final_text": row.final_text,
            "error_key": row.error_key,
            "candidates": row.candidates,
            "created_at": row.created_at,
        })
    };
    let whole = view(&row.text, false);
    if whole.to_string().len() <= TURN_PAGE_BOUND {
        return whole;
    }
    view(&preview(&row.text, TURN_TEXT_PREVIEW), true)
}

fn execution_json(row: &ExecutionSummary) -> Value {
    json!({
        "execution_public_id": row.public_id,
        "conversation_public_id": row.conversation_public_id,
        "input_public_id": row.input_public_id,
        "turn": row.turn,
        "member_public_id": row.member_public_id,
        "status": row.status,
        "attention_reason": row.attention_reason,
        "error_key": row.error_key,
        "round": row.round,
        "created_at": row.created_at,
        "updated_at": row.updated_at,
    })
}

/// The leading `limit` rows of a page read with one extra row, and whether more follow.
fn split_page<T>(mut rows: Vec<T>, limit: i64) -> (Vec<T>, bool) {
    let limit = usize::try_from(limit).unwrap_or(usize::MAX);
    let more = rows.len() > limit;
    rows.truncate(limit);
    (rows, more)
}

impl Api {
    /// `GET /agent_api/v1/conversations?after=&limit=` (gRPC `ListConversations`): the readable
    /// conversations ([`readable_agents`]), newest first (by creation), `limit` of them (1 to 200,
    /// default 100), older than the one `after` names. Answers `{conversations:[{
    /// conversation_public_id, member_public_id, created_at, turn_count, last_turn_at,
    /// last_execution_public_id, last_status}], next_cursor}`; `next_cursor` is the last item's
    /// id when more follow, else null.
    ///
    /// # Errors
    /// 400 `parameter_invalid` for a `limit` out of bounds, an `after` that is not a UUID or
    /// names no readable conversation.
    pub async fn list_conversations(&self, caller: &Caller, after: Option<&str>, limit: i64) -> Result<Value, Refusal> {
        let members = readable_agents(self, caller).await?;
        let store = &self.fabric.store;
        let keyset = match after {
            None => None,
            Some(text) => {
                let id: ConversationId = text.parse().map_err(|_| uuid_refusal("after"))?;
                let (_, created_at) = store
                    .conversation_owner(id)
                    .await
                    .map_err(internal)?
                    .filter(|(owner, _)| members.contains(owner))
                    .ok_or_else(|| stale_cursor("conversation"))?;
                Some(Keyset { created_at, public_id: id.to_string() })
            }
        };
        let rows = store.conversations_page(&members, keyset.as_ref(), limit + 1).await.map_err(internal)?;
        let (rows, more) = split_page(rows, limit);
        let next_cursor = more.then(|| rows.last().map(|row| row.public_id.to_string())).flatten();
        Ok(json!({"conversations": rows.iter().map(conversation_json).collect::<Vec<_>>(), "next_cursor": next_cursor}))
    }

    /// `GET /agent_api/v1/conversations/{id}?turns_after=` (gRPC `GetConversation`): a readable
    /// conversation and a page of its turns in order, after turn `turns_after` (0, or absent, from
    /// the first): `{conversation_public_id, member_public_id, created_at, turns:[{turn,
    /// input_public_id, text, text_truncated, posted_by_public_id, execution_public_id, status,
    /// final_text, error_key, candidates, created_at}], turns_next}`. Each turn shows the execution
    /// that answers it (its newest `completed` candidate, else its newest; `candidates` counts them). A page holds
    /// at most [`TURN_PAGE_MAX`] turns and [`TURN_PAGE_BOUND`] bytes of turn JSON (at least one
    /// turn); `turns_next` is its last turn's number when more follow, else null.
    ///
    /// # Errors
    /// 404 `not_found` for an unknown conversation or one the caller may not read.
    pub async fn conversation(&self, caller: &Caller, id: ConversationId, turns_after: i64) -> Result<Value, Refusal> {
        let store = &self.fabric.store;
        // One standing rule with the execution doors: 404 for an unknown or another Agent's
        // conversation, 403 for a Human without a grant.
        self.conversation_for(caller, id, super::standing::Need::Read).await?;
        let (owner, created_at) =
            store.conversation_owner(id).await.map_err(internal)?.ok_or_else(|| missing_conversation(id))?;
        let mut page = Vec::new();
        let mut bytes = 0;
        let mut cursor = turns_after.max(0);
        let mut turns_next = None;
        'page: loop {
            let rows = store.turns_after(id, cursor, TURN_CHUNK).await.map_err(internal)?;
            let full = i64::try_from(rows.len()).is_ok_and(|n| n == TURN_CHUNK);
            for row in &rows {
                let view = turn_json(row);
                let size = view.to_string().len();
                if page.len() == TURN_PAGE_MAX || (!page.is_empty() && bytes + size > TURN_PAGE_BOUND) {
                    turns_next = Some(cursor);
                    break 'page;
                }
                bytes += size;
                cursor = row.turn;
                page.push(view);
            }
            if !full {
                break;
            }
        }
        Ok(json!({
            "conversation_public_id": id,
            "member_public_id": owner,
            "created_at": created_at,
            "turns": page,
            "turns_next": turns_next,
        }))
    }

    /// `GET /agent_api/v1/executions?conversation=&status=&after=&limit=` (gRPC
    /// `ListExecutions`): the readable executions ([`readable_agents`]), newest first (by
    /// creation), of one conversation and in one run status when asked, `limit` of them (1 to
    /// 200, default 100), older than the one `after` names. Answers `{executions:[{
    /// execution_public_id, conversation_public_id, input_public_id, turn, member_public_id,
    /// status, attention_reason, error_key, round, created_at, updated_at}], next_cursor}`; an
    /// execution's answer and tasks are read with `GET /agent_api/v1/executions/{id}`.
    ///
    /// # Errors
    /// 400 `parameter_invalid` for a `limit` out of bounds, a `status` that is not a run status,
    /// a `conversation` or `after` that is not a UUID, an `after` that names no readable
    /// execution; 404 `not_found` for a `conversation` the caller may not read.
    pub async fn list_executions(
        &self,
        caller: &Caller,
        conversation: Option<&str>,
        status: Option<&str>,
        after: Option<&str>,
        limit: i64,
    ) -> Result<Value, Refusal> {
        let store = &self.fabric.store;
        let members = readable_agents(self, caller).await?;
        let conversation = conversation
            .map(|text| text.parse::<ConversationId>().map_err(|_| uuid_refusal("conversation")))
            .transpose()?;
        let status = status.map(status_filter).transpose()?;
        let after = after.map(|text| text.parse::<ExecutionId>().map_err(|_| uuid_refusal("after"))).transpose()?;
        if let Some(id) = conversation {
            self.conversation_for(caller, id, super::standing::Need::Read).await?;
        }
        let keyset = match after {
            None => None,
            Some(id) => {
                let (_, created_at) = store
                    .execution_owner(id)
                    .await
                    .map_err(internal)?
                    .filter(|(owner, _)| members.contains(owner))
                    .ok_or_else(|| stale_cursor("execution"))?;
                Some(Keyset { created_at, public_id: id.to_string() })
            }
        };
        let filter = ExecutionFilter { conversation, status };
        let rows = store.executions_page(&members, filter, keyset.as_ref(), limit + 1).await.map_err(internal)?;
        let (rows, more) = split_page(rows, limit);
        let next_cursor = more.then(|| rows.last().map(|row| row.public_id.to_string())).flatten();
        Ok(json!({"executions": rows.iter().map(execution_json).collect::<Vec<_>>(), "next_cursor": next_cursor}))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nexus_proto::InputId;

    #[test]
    fn limits_are_the_event_pages_bounds() {
        assert_eq!(listing_limit(None).ok(), Some(100));
        assert_eq!(listing_limit(Some(1)).ok(), Some(1));
        assert_eq!(listing_limit(Some(200)).ok(), Some(200));
        for bad in [Some(0), Some(201), Some(u64::MAX)] {
            assert_eq!(listing_limit(bad).unwrap_err().code, ErrorCode::ParameterInvalid, "{bad:?}");
        }
        for bad in ["0", "201", "-1", "ten", "", "1.5"] {
            assert_eq!(listing_limit_text(Some(bad)).unwrap_err().code, ErrorCode::ParameterInvalid, "{bad}");
        }
        assert_eq!(listing_limit_text(Some("7")).ok(), Some(7));
    }

    #[test]
    fn status_filters_take_the_run_status_words_only() {
        for status in RunStatus::ALL {
            assert_eq!(status_filter(status.as_str()).ok(), Some(*status));
        }
        for bad in ["failed", "Completed", "", "done"] {
            let refusal = status_filter(bad).unwrap_err();
            assert_eq!(refusal.code, ErrorCode::ParameterInvalid, "{bad}");
            assert!(refusal.message.contains("needs_attention"), "{}", refusal.message);
        }
    }

    #[test]
    fn pages_split_at_their_limit() {
        assert_eq!(split_page(vec![1, 2, 3], 2), (vec![1, 2], true));
        assert_eq!(split_page(vec![1, 2], 2), (vec![1, 2], false));
        assert_eq!(split_page(Vec::<i32>::new(), 2), (vec![], false));
    }

    #[test]
    fn a_turn_too_large_alone_shows_a_preview_of_its_text() {
        let row = |text: String| TurnRow {
            turn: 1,
            input_public_id: InputId::new_v4(),
            text,
            posted_by_public_id: None,
            created_at: 1,
            candidates: 1,
            execution_public_id: None,
            status: None,
            final_text: None,
            error_key: None,
        };
        let small = turn_json(&row("hello".into()));
        assert_eq!((small["text"].as_str(), small["text_truncated"].as_bool()), (Some("hello"), Some(false)));
        // A megabyte of control characters is six megabytes of JSON.
        let escaped = turn_json(&row("\u{1}".repeat(1_048_576)));
        assert_eq!(escaped["text_truncated"], true);
        assert!(escaped.to_string().len() <= TURN_PAGE_BOUND);
    }
}
