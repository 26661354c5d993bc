//! The reads of the history tools `session_search` and `session_read` (`docs/kernel-tools.md`,
//! "session_search and session_read"): the turns of the conversations an execution reaches,
//! searched by text newest first or read in order, each with the answer of the execution that
//! answers it ([`super::conversations::answering_candidate`], as the history reads it).
//!
//! Every read filters on the answering Agent: no reach ever shows another Agent's turn. The search
//! walks the Agent's inputs on their own index (migration 0016).

use sqlx::Row;
use sqlx::any::AnyRow;

use nexus_proto::{ConversationId, InputId, MemberId, RunStatus};

use super::conversations::answering_candidate;
use super::{Store, StoreResult, parse, parse_opt};

/// The most characters of an input's text and of its answer one [`Store::turn_range`] row
/// carries: `session_read`'s whole page is at most this many characters, so no turn can show
/// more. The full lengths come beside them.
pub const SESSION_TEXT_CUT: i64 = 12_000;

/// The conversations a history read may see: the Agent's own, narrowed to `within` when given
/// (the `subtree` reach: the current conversation and its descendants).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reachable {
    /// The answering Agent: only its conversations are ever read.
    pub agent: MemberId,
    /// Only these of them, when given; `None` is every conversation of the Agent (`workspace`).
    pub within: Option<Vec<ConversationId>>,
}

/// Where a search page starts: strictly older than this input (`created_at` descending, then
/// `public_id` descending), the last hit of the page before.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TurnCursor {
    /// The input's admission time, Unix milliseconds.
    pub created_at: i64,
    /// The input.
    pub input_public_id: InputId,
}

/// One turn as the history tools read it: the input and the answer of the execution that answers
/// it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TurnText {
    /// Its conversation.
    pub conversation_public_id: ConversationId,
    /// The input (the turn's id).
    pub input_public_id: InputId,
    /// Its place in the conversation, from 1.
    pub turn: i64,
    /// When it was admitted, Unix milliseconds.
    pub created_at: i64,
    /// The input's text: whole from [`Store::search_turns`], its first [`SESSION_TEXT_CUT`]
    /// characters from [`Store::turn_range`].
    pub text: String,
    /// The input text's full length, in characters.
    pub text_chars: i64,
    /// The answering execution's status, `None` before any execution answers it.
    pub status: Option<RunStatus>,
    /// Its final text (cut as `text` is), `None` until it has one.
    pub answer: Option<String>,
    /// The final text's full length, in characters (0 without one).
    pub answer_chars: i64,
}

/// `%needle%` lowercased, with the LIKE metacharacters `%`, `_` and the escape `!` escaped by `!`.
fn like_pattern(needle: &str) -> String {
    let mut pattern = String::with_capacity(needle.len() + 2);
    pattern.push('%');
    for c in needle.to_lowercase().chars() {
        if matches!(c, '%' | '_' | '!') {
            pattern.push('!');
        }
        pattern.push(c);
    }
    pattern.push('%');
    pattern
}

/// `$from, …` for `count` values, numbered from `from`.
fn placeholders(from: usize, count: usize) -> String {
    (from..from + count).map(|n| format!("${n}")).collect::<Vec<_>>().join(", ")
}

fn turn_text(row: &AnyRow) -> StoreResult<TurnText> {
    Ok(TurnText {
        conversation_public_id: parse(&row.try_get::<String, _>("conversation_public_id")?)?,
        input_public_id: parse(&row.try_get::<String, _>("public_id")?)?,
        turn: row.try_get("turn")?,
        created_at: row.try_get("created_at")?,
        text: row.try_get("text")?,
        text_chars: row.try_get::<Option<i64>, _>("text_chars")?.unwrap_or(0),
        status: parse_opt(row.try_get("status")?)?,
        answer: row.try_get("answer")?,
        answer_chars: row.try_get::<Option<i64>, _>("answer_chars")?.unwrap_or(0),
    })
}

impl Store {
    /// Whether `conversation` exists, belongs to `reach.agent` and lies within `reach`. One
    /// answer for a conversation that does not exist and for one of another Agent.
    ///
    /// # Errors
    /// [`super::StoreError`] on a database failure.
    pub async fn conversation_reachable(&self, reach: &Reachable, conversation: ConversationId) -> StoreResult<bool> {
        if reach.within.as_ref().is_some_and(|within| !within.contains(&conversation)) {
            return Ok(false);
        }
        let row = sqlx::query("SELECT public_id FROM conversations WHERE public_id = $1 AND member_public_id = $2")
            .bind(conversation.to_string())
            .bind(reach.agent.to_string())
            .fetch_optional(self.reader())
            .await?;
        Ok(row.is_some())
    }

    /// The turns of the reachable conversations whose input text or answer contains `needle`,
    /// ASCII letters matched without regard to case (PostgreSQL folds every letter), newest first
    /// (`created_at`, then id, descending), older than `before` when given, leaving out the input
    /// `except` (the calling turn), at most `limit`. Texts come whole.
    ///
    /// # Errors
    /// [`super::StoreError`] on a database failure.
    pub async fn search_turns(
        &self,
        reach: &Reachable,
        needle: &str,
        except: InputId,
        before: Option<&TurnCursor>,
        limit: i64,
    ) -> StoreResult<Vec<TurnText>> {
        let within = match &reach.within {
            Some(within) if within.is_empty() => return Ok(Vec::new()),
            Some(within) => format!(" AND i.conversation_public_id IN ({})", placeholders(4, within.len())),
            None => String::new(),
        };
        let next = 4 + reach.within.as_ref().map_or(0, Vec::len);
        let keyset = match before {
            Some(_) => {
                format!(" AND (i.created_at < ${0} OR (i.created_at = ${0} AND i.public_id < ${1}))", next, next + 1)
            }
            None => String::new(),
        };
        let limit_at = if before.is_some() { next + 2 } else { next };
        let sql = format!(
            "SELECT i.public_id, i.conversation_public_id, i.turn, i.created_at, i.text, \
             CAST(LENGTH(i.text) AS BIGINT) AS text_chars, e.status, e.final_text AS answer, \
             CAST(LENGTH(e.final_text) AS BIGINT) AS answer_chars \
             FROM inputs i JOIN conversations c ON c.public_id = i.conversation_public_id \
             LEFT JOIN executions e ON e.public_id = {} \
             WHERE i.member_public_id = $1 AND c.member_public_id = $1 AND i.public_id <> $3{within}{keyset} \
             AND (LOWER(i.text) LIKE $2 ESCAPE '!' OR LOWER(e.final_text) LIKE $2 ESCAPE '!') \
             ORDER BY i.created_at DESC, i.public_id DESC LIMIT ${limit_at}",
            answering_candidate("i.public_id"),
        );
        let mut query = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(reach.agent.to_string())
            .bind(like_pattern(needle))
            .bind(except.to_string());
        for conversation in reach.within.iter().flatten() {
            query = query.bind(conversation.to_string());
        }
        if let Some(before) = before {
            query = query.bind(before.created_at).bind(before.input_public_id.to_string());
        }
        let rows = query.bind(limit).fetch_all(self.reader()).await?;
        rows.iter().map(turn_text).collect()
    }

    /// The turns of `conversation` strictly between `after` and `before` (turn numbers; `None`
    /// is no upper bound), at most `limit`: the first of them, or with `newest` the last, always
    /// answered in order. Each text is cut at [`SESSION_TEXT_CUT`] characters. Reachability is the
    /// caller's to check first ([`Store::conversation_reachable`]).
    ///
    /// # Errors
    /// [`super::StoreError`] on a database failure.
    pub async fn turn_range(
        &self,
        conversation: ConversationId,
        after: i64,
        before: Option<i64>,
        newest: bool,
        limit: i64,
    ) -> StoreResult<Vec<TurnText>> {
        let order = if newest { "DESC" } else { "ASC" };
        let sql = format!(
            "SELECT i.public_id, i.conversation_public_id, i.turn, i.created_at, \
             SUBSTR(i.text, 1, {SESSION_TEXT_CUT}) AS text, CAST(LENGTH(i.text) AS BIGINT) AS text_chars, e.status, \
             SUBSTR(e.final_text, 1, {SESSION_TEXT_CUT}) AS answer, CAST(LENGTH(e.final_text) AS BIGINT) AS answer_chars \
             FROM inputs i LEFT JOIN executions e ON e.public_id = {} \
             WHERE i.conversation_public_id = $1 AND i.turn > $2 AND i.turn < $3 ORDER BY i.turn {order} LIMIT $4",
            answering_candidate("i.public_id"),
        );
        let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(conversation.to_string())
            .bind(after)
            .bind(before.unwrap_or(i64::MAX))
            .bind(limit)
            .fetch_all(self.reader())
            .await?;
        let mut turns = rows.iter().map(turn_text).collect::<StoreResult<Vec<_>>>()?;
        if newest {
            turns.reverse();
        }
        Ok(turns)
    }

    /// The turn number of `input` in `conversation`, `None` when it is not one of its inputs.
    ///
    /// # Errors
    /// [`super::StoreError`] on a database failure.
    pub async fn turn_of(&self, conversation: ConversationId, input: InputId) -> StoreResult<Option<i64>> {
        let row = sqlx::query("SELECT turn FROM inputs WHERE public_id = $1 AND conversation_public_id = $2")
            .bind(input.to_string())
            .bind(conversation.to_string())
            .fetch_optional(self.reader())
            .await?;
        row.map(|row| row.try_get("turn")).transpose().map_err(Into::into)
    }

    /// How many turns `conversation` has (its last turn's number; 0 without one).
    ///
    /// # Errors
    /// [`super::StoreError`] on a database failure.
    pub async fn turn_count(&self, conversation: ConversationId) -> StoreResult<i64> {
        let row = sqlx::query("SELECT MAX(turn) AS turns FROM inputs WHERE conversation_public_id = $1")
            .bind(conversation.to_string())
            .fetch_one(self.reader())
            .await?;
        Ok(row.try_get::<Option<i64>, _>("turns")?.unwrap_or(0))
    }
}

#[cfg(test)]
mod tests {
    use super::like_pattern;

    #[test]
    fn like_metacharacters_are_escaped_and_the_needle_lowercased() {
        assert_eq!(like_pattern("Zebra"), "%zebra%");
        assert_eq!(like_pattern("100%_done!"), "%100!%!_done!!%");
    }
}
