//! A conversation's history: its earlier turns as the model last saw them
//! (`docs/prompt.md`, "History").

use sqlx::Row;

use nexus_proto::{ConversationId, ExecutionId, InputId, RunStatus};

use crate::model::ChatMessage;
use crate::model::prompt::HistoryTurn;

use super::{Store, StoreResult, parse};

/// The most earlier turns one history read returns, the newest kept: a request carries at most
/// 200 history entries, and every turn is at least one (its input).
pub const HISTORY_TURNS_BOUND: i64 = 200;

impl Store {
    /// The turns of `conversation` before `before_turn` (at most [`HISTORY_TURNS_BOUND`], the
    /// newest), oldest first: each input with the transcript of the execution that answers it:
    /// its newest `completed` execution, else its newest (a regeneration answers the same input
    /// again, and once it completes its answer is the one the conversation keeps; one that was
    /// stopped or failed leaves the earlier answer in place). An input whose execution has not
    /// stored a message yet carries an empty transcript.
    ///
    /// # Errors
    /// [`super::StoreError`] on a database failure or a stored message that does not parse.
    pub async fn conversation_history(
        &self,
        conversation: ConversationId,
        before_turn: i64,
    ) -> StoreResult<Vec<HistoryTurn>> {
        let rows = sqlx::query(
            "SELECT i.public_id AS input_public_id, i.turn AS turn, e.public_id AS execution_public_id, \
             e.status AS status \
             FROM inputs i JOIN executions e ON e.input_public_id = i.public_id \
             WHERE i.conversation_public_id = $1 AND i.turn < $2 AND i.turn >= $3 \
             ORDER BY i.turn, e.created_at, e.public_id",
        )
        .bind(conversation.to_string())
        .bind(before_turn)
        .bind(before_turn.saturating_sub(HISTORY_TURNS_BOUND))
        .fetch_all(self.reader())
        .await?;
        // The answering execution of each input: the last completed row of its turn, else its
        // last row (`newest` holds `(input, turn, execution, completed)`).
        let mut newest: Vec<(InputId, i64, ExecutionId, bool)> = Vec::new();
        for row in &rows {
            let input: InputId = parse(&row.try_get::<String, _>("input_public_id")?)?;
            let turn: i64 = row.try_get("turn")?;
            let execution: ExecutionId = parse(&row.try_get::<String, _>("execution_public_id")?)?;
            let completed = parse::<RunStatus>(&row.try_get::<String, _>("status")?)? == RunStatus::Completed;
            match newest.last_mut() {
                Some(last) if last.0 == input => {
                    if completed || !last.3 {
                        *last = (input, turn, execution, completed);
                    }
                }
                _ => newest.push((input, turn, execution, completed)),
            }
        }
        let mut turns = Vec::with_capacity(newest.len());
        for (input_public_id, turn, execution_public_id, _) in newest {
            let Some(row) = self.execution(execution_public_id).await? else { continue };
            let messages: Vec<ChatMessage> = serde_json::from_value(row.transcript)?;
            turns.push(HistoryTurn { input_public_id, execution_public_id, turn, messages });
        }
        Ok(turns)
    }
}
