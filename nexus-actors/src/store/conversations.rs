//! The history reads (`docs/executions.md`, "History"): a member's conversations and executions,
//! newest first, and a conversation's turns in order. Every read is one page: the listings page
//! with a keyset on `(created_at, public_id)` descending, the turns on the turn number, each on its
//! own index (migration 0013), so a page costs what it shows.

use sqlx::Row;
use sqlx::any::AnyRow;

use nexus_proto::{AttentionReason, ConversationId, ExecutionId, InputId, MemberId, RunStatus};

use super::{Store, StoreResult, parse, parse_opt};

/// Where a newest-first page starts: strictly older than this row (`created_at` descending, then
/// `public_id` descending), the last row of the page before.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Keyset {
    /// The row's creation time, Unix milliseconds.
    pub created_at: i64,
    /// The row's id, as stored.
    pub public_id: String,
}

/// A conversation as the listing shows it.
#[derive(Clone, Debug, PartialEq)]
pub struct ConversationSummary {
    /// The conversation.
    pub public_id: ConversationId,
    /// The answering Agent.
    pub member_public_id: MemberId,
    /// When it began, Unix milliseconds.
    pub created_at: i64,
    /// How many turns it has (its last turn's number).
    pub turns: i64,
    /// When its last turn was admitted; `None` for a conversation with no input.
    pub last_turn_at: Option<i64>,
    /// The newest execution of its last turn (its newest candidate when regenerated).
    pub last_execution_public_id: Option<ExecutionId>,
    /// That execution's status.
    pub last_status: Option<RunStatus>,
}

/// One turn of a conversation: its input and the newest execution that answers it.
#[derive(Clone, Debug, PartialEq)]
pub struct TurnRow {
    /// Its place in the conversation, from 1.
    pub turn: i64,
    /// The input.
    pub input_public_id: InputId,
    /// The input's text.
    pub text: String,
    /// The Human who posted it for the Agent, `None` when the Agent posted it itself.
    pub posted_by_public_id: Option<MemberId>,
    /// When it was admitted, Unix milliseconds.
    pub created_at: i64,
    /// How many executions answer it: 1, more once regenerated.
    pub candidates: i64,
    /// The newest of them.
    pub execution_public_id: Option<ExecutionId>,
    /// Its status.
    pub status: Option<RunStatus>,
    /// Its final answer.
    pub final_text: Option<String>,
    /// Its failure key.
    pub error_key: Option<String>,
}

/// An execution as the listing shows it: the row without its declaration, transcript and answer.
#[derive(Clone, Debug, PartialEq)]
pub struct ExecutionSummary {
    /// The execution.
    pub public_id: ExecutionId,
    /// Its conversation.
    pub conversation_public_id: ConversationId,
    /// The input it answers.
    pub input_public_id: InputId,
    /// That input's turn.
    pub turn: i64,
    /// The answering Agent.
    pub member_public_id: MemberId,
    /// Its status.
    pub status: RunStatus,
    /// Why it needs attention, while `needs_attention`.
    pub attention_reason: Option<AttentionReason>,
    /// Its failure key.
    pub error_key: Option<String>,
    /// The last round started.
    pub round: i64,
    /// Creation time, Unix milliseconds.
    pub created_at: i64,
    /// Last update, Unix milliseconds.
    pub updated_at: i64,
}

/// What [`Store::executions_page`] keeps.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ExecutionFilter {
    /// Only this conversation's.
    pub conversation: Option<ConversationId>,
    /// Only executions in this status.
    pub status: Option<RunStatus>,
}

/// `$from, …` for `count` values, numbered from `from`.
fn placeholders(from: usize, count: usize) -> String {
    (from..from + count).map(|n| format!("${n}")).collect::<Vec<_>>().join(", ")
}

/// The candidate that answers the input `input` (a column), as a scalar subquery: its newest
/// `completed` execution, else its newest, as the history reads it (`docs/prompt.md`,
/// "History"): a regeneration that was stopped or failed leaves the earlier answer in place.
pub(super) fn answering_candidate(input: &str) -> String {
    format!(
        "(SELECT n.public_id FROM executions n WHERE n.input_public_id = {input} \
         ORDER BY CASE WHEN n.status = 'completed' THEN 1 ELSE 0 END DESC, n.created_at DESC, n.public_id DESC LIMIT 1)"
    )
}

impl Store {
    /// The owner and creation time of a conversation, `None` when there is no such conversation.
    ///
    /// # Errors
    /// [`super::StoreError`] on a database failure.
    pub async fn conversation_owner(&self, conversation: ConversationId) -> StoreResult<Option<(MemberId, i64)>> {
        let row = sqlx::query("SELECT member_public_id, created_at FROM conversations WHERE public_id = $1")
            .bind(conversation.to_string())
            .fetch_optional(self.reader())
            .await?;
        row.map(|row| Ok((parse(&row.try_get::<String, _>("member_public_id")?)?, row.try_get("created_at")?)))
            .transpose()
    }

    /// The conversations of `members`, newest first, older than `after` when given, at most
    /// `limit`.
    ///
    /// # Errors
    /// [`super::StoreError`] on a database failure.
    pub async fn conversations_page(
        &self,
        members: &[MemberId],
        after: Option<&Keyset>,
        limit: i64,
    ) -> StoreResult<Vec<ConversationSummary>> {
        if members.is_empty() {
            return Ok(Vec::new());
        }
        let n = members.len();
        let keyset = match after {
            Some(_) => {
                format!(" AND (c.created_at < ${0} OR (c.created_at = ${0} AND c.public_id < ${1}))", n + 1, n + 2)
            }
            None => String::new(),
        };
        let limit_at = if after.is_some() { n + 3 } else { n + 1 };
        let sql = format!(
            "SELECT c.public_id, c.member_public_id, c.created_at, l.turn AS turns, l.created_at AS last_turn_at, \
             e.public_id AS last_execution, e.status AS last_status FROM conversations c \
             LEFT JOIN inputs l ON l.public_id = (SELECT i.public_id FROM inputs i \
               WHERE i.conversation_public_id = c.public_id ORDER BY i.turn DESC LIMIT 1) \
             LEFT JOIN executions e ON e.public_id = {} \
             WHERE c.member_public_id IN ({}){keyset} ORDER BY c.created_at DESC, c.public_id DESC LIMIT ${limit_at}",
            answering_candidate("l.public_id"),
            placeholders(1, n),
        );
        let mut query = sqlx::query(sqlx::AssertSqlSafe(sql));
        for member in members {
            query = query.bind(member.to_string());
        }
        if let Some(after) = after {
            query = query.bind(after.created_at).bind(after.public_id.clone());
        }
        let rows = query.bind(limit).fetch_all(self.reader()).await?;
        rows.iter()
            .map(|row| {
                Ok(ConversationSummary {
                    public_id: parse(&row.try_get::<String, _>("public_id")?)?,
                    member_public_id: parse(&row.try_get::<String, _>("member_public_id")?)?,
                    created_at: row.try_get("created_at")?,
                    turns: row.try_get::<Option<i64>, _>("turns")?.unwrap_or(0),
                    last_turn_at: row.try_get("last_turn_at")?,
                    last_execution_public_id: parse_opt(row.try_get("last_execution")?)?,
                    last_status: parse_opt(row.try_get("last_status")?)?,
                })
            })
            .collect()
    }

    /// The turns of a conversation after turn `after` (0 for the first), in order, at most
    /// `limit`, each with the execution that answers it ([`answering_candidate`]).
    ///
    /// # Errors
    /// [`super::StoreError`] on a database failure.
    pub async fn turns_after(&self, conversation: ConversationId, after: i64, limit: i64) -> StoreResult<Vec<TurnRow>> {
        let sql = format!(
            "SELECT i.public_id, i.turn, i.text, i.posted_by_public_id, i.created_at, \
             (SELECT COUNT(*) FROM executions c WHERE c.input_public_id = i.public_id) AS candidates, \
             e.public_id AS execution_public_id, e.status, e.final_text, e.error_key FROM inputs i \
             LEFT JOIN executions e ON e.public_id = {} \
             WHERE i.conversation_public_id = $1 AND i.turn > $2 ORDER BY i.turn LIMIT $3",
            answering_candidate("i.public_id"),
        );
        let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(conversation.to_string())
            .bind(after)
            .bind(limit)
            .fetch_all(self.reader())
            .await?;
        rows.iter()
            .map(|row| {
                Ok(TurnRow {
                    turn: row.try_get("turn")?,
                    input_public_id: parse(&row.try_get::<String, _>("public_id")?)?,
                    text: row.try_get("text")?,
                    posted_by_public_id: parse_opt(row.try_get("posted_by_public_id")?)?,
                    created_at: row.try_get("created_at")?,
                    candidates: row.try_get("candidates")?,
                    execution_public_id: parse_opt(row.try_get("execution_public_id")?)?,
                    status: parse_opt(row.try_get("status")?)?,
                    final_text: row.try_get("final_text")?,
                    error_key: row.try_get("error_key")?,
                })
            })
            .collect()
    }

    /// The owner and creation time of an execution, `None` when there is no such execution.
    ///
    /// # Errors
    /// [`super::StoreError`] on a database failure.
    pub async fn execution_owner(&self, execution: ExecutionId) -> StoreResult<Option<(MemberId, i64)>> {
        let row = sqlx::query("SELECT member_public_id, created_at FROM executions WHERE public_id = $1")
            .bind(execution.to_string())
            .fetch_optional(self.reader())
            .await?;
        row.map(|row| Ok((parse(&row.try_get::<String, _>("member_public_id")?)?, row.try_get("created_at")?)))
            .transpose()
    }

    /// The executions of `members` that pass `filter`, newest first, older than `after` when
    /// given, at most `limit`.
    ///
    /// # Errors
    /// [`super::StoreError`] on a database failure.
    pub async fn executions_page(
        &self,
        members: &[MemberId],
        filter: ExecutionFilter,
        after: Option<&Keyset>,
        limit: i64,
    ) -> StoreResult<Vec<ExecutionSummary>> {
        if members.is_empty() {
            return Ok(Vec::new());
        }
        let mut next = members.len() + 1;
        let mut place = || {
            let at = next;
            next += 1;
            format!("${at}")
        };
        let mut sql = format!(
            "SELECT e.public_id, e.conversation_public_id, e.input_public_id, i.turn, e.member_public_id, e.status, \
             e.attention_reason, e.error_key, e.round, e.created_at, e.updated_at FROM executions e \
             JOIN inputs i ON i.public_id = e.input_public_id WHERE e.member_public_id IN ({})",
            placeholders(1, members.len())
        );
        if filter.conversation.is_some() {
            sql.push_str(&format!(" AND e.conversation_public_id = {}", place()));
        }
        if filter.status.is_some() {
            sql.push_str(&format!(" AND e.status = {}", place()));
        }
        if after.is_some() {
            let (created, id) = (place(), place());
            sql.push_str(&format!(
                " AND (e.created_at < {created} OR (e.created_at = {created} AND e.public_id < {id}))"
            ));
        }
        sql.push_str(&format!(" ORDER BY e.created_at DESC, e.public_id DESC LIMIT {}", place()));
        let mut query = sqlx::query(sqlx::AssertSqlSafe(sql));
        for member in members {
            query = query.bind(member.to_string());
        }
        if let Some(conversation) = filter.conversation {
            query = query.bind(conversation.to_string());
        }
        if let Some(status) = filter.status {
            query = query.bind(status.as_str());
        }
        if let Some(after) = after {
            query = query.bind(after.created_at).bind(after.public_id.clone());
        }
        let rows = query.bind(limit).fetch_all(self.reader()).await?;
        rows.iter().map(execution_summary).collect()
    }
}

fn execution_summary(row: &AnyRow) -> StoreResult<ExecutionSummary> {
    Ok(ExecutionSummary {
        public_id: parse(&row.try_get::<String, _>("public_id")?)?,
        conversation_public_id: parse(&row.try_get::<String, _>("conversation_public_id")?)?,
        input_public_id: parse(&row.try_get::<String, _>("input_public_id")?)?,
        turn: row.try_get("turn")?,
        member_public_id: parse(&row.try_get::<String, _>("member_public_id")?)?,
        status: parse(&row.try_get::<String, _>("status")?)?,
        attention_reason: parse_opt(row.try_get("attention_reason")?)?,
        error_key: row.try_get("error_key")?,
        round: row.try_get("round")?,
        created_at: row.try_get("created_at")?,
        updated_at: row.try_get("updated_at")?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placeholders_number_on() {
        assert_eq!(placeholders(1, 3), "$1, $2, $3");
        assert_eq!(placeholders(4, 1), "$4");
    }
}
