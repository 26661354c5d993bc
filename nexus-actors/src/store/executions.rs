//! Conversations, inputs, executions and their event logs.

use std::sync::Arc;

use serde_json::Value;
use sqlx::{AnyConnection, Row};

use nexus_proto::{ConversationId, ExecutionId, InputId, MemberId};

use super::tasks::insert_task;
use super::{Event, EventRow, ExecutionRow, InputRow, Store, StoreResult, TaskRow, json_opt, parse, parse_opt};

impl Store {
    /// Admits an input: creates the conversation when new, the input and its pending execution,
    /// in one transaction.
    ///
    /// # Errors
    /// [`StoreError`] on a database failure.
    pub async fn admit_input(
        &self,
        input: &InputRow,
        new_conversation: bool,
        execution_public_id: ExecutionId,
    ) -> StoreResult<()> {
        // Group-committed: answered once the batch holding this write is durable.
        let input = Arc::new(input.clone());
        let now = self.clock.now_ms();
        self.writer
            .write(move |connection| {
                let input = input.clone();
                Box::pin(
                    async move { admit_input_in(connection, &input, new_conversation, execution_public_id, now).await },
                )
            })
            .await
    }

    /// Whether a conversation exists and belongs to the member.
    ///
    /// # Errors
    /// [`StoreError`] on a database failure.
    pub async fn conversation_owned_by(&self, conversation: ConversationId, member: MemberId) -> StoreResult<bool> {
        let row = sqlx::query("SELECT 1 FROM conversations WHERE public_id = $1 AND member_public_id = $2")
            .bind(conversation.to_string())
            .bind(member.to_string())
            .fetch_optional(self.reader())
            .await?;
        Ok(row.is_some())
    }

    /// Reads an input.
    ///
    /// # Errors
    /// [`StoreError`] on a database failure.
    pub async fn input(&self, public_id: InputId) -> StoreResult<Option<InputRow>> {
        let row = sqlx::query(
            "SELECT conversation_public_id, member_public_id, text, execution_declaration, runner_executor_public_id, \
             tool_names FROM inputs WHERE public_id = $1",
        )
        .bind(public_id.to_string())
        .fetch_optional(self.reader())
        .await?;
        row.map(|row| {
            Ok(InputRow {
                public_id,
                conversation_public_id: parse(&row.try_get::<String, _>("conversation_public_id")?)?,
                member_public_id: parse(&row.try_get::<String, _>("member_public_id")?)?,
                text: row.try_get("text")?,
                execution_declaration: json_opt(row.try_get("execution_declaration")?)?,
                runner_executor_public_id: parse_opt(row.try_get("runner_executor_public_id")?)?,
                tool_names: json_opt(row.try_get("tool_names")?)?,
            })
        })
        .transpose()
    }

    /// Reads an execution.
    ///
    /// # Errors
    /// [`StoreError`] on a database failure.
    pub async fn execution(&self, public_id: ExecutionId) -> StoreResult<Option<ExecutionRow>> {
        let row = sqlx::query(
            "SELECT conversation_public_id, input_public_id, member_public_id, status, attention_reason, declaration, \
             transcript, round, final_text, error_key, event_seq, created_at, updated_at FROM executions WHERE public_id = $1",
        )
        .bind(public_id.to_string())
        .fetch_optional(self.reader())
        .await?;
        row.map(|row| {
            Ok(ExecutionRow {
                public_id,
                conversation_public_id: parse(&row.try_get::<String, _>("conversation_public_id")?)?,
                input_public_id: parse(&row.try_get::<String, _>("input_public_id")?)?,
                member_public_id: parse(&row.try_get::<String, _>("member_public_id")?)?,
                status: parse(&row.try_get::<String, _>("status")?)?,
                attention_reason: parse_opt(row.try_get("attention_reason")?)?,
                declaration: json_opt(row.try_get("declaration")?)?,
                transcript: serde_json::from_str(&row.try_get::<String, _>("transcript")?)?,
                round: row.try_get("round")?,
                final_text: row.try_get("final_text")?,
                error_key: row.try_get("error_key")?,
                event_seq: row.try_get("event_seq")?,
                created_at: row.try_get("created_at")?,
                updated_at: row.try_get("updated_at")?,
            })
        })
        .transpose()
    }

    /// Executions that have not reached a terminal status, for recovery at start-up.
    ///
    /// # Errors
    /// [`StoreError`] on a database failure.
    pub async fn live_executions(&self) -> StoreResult<Vec<ExecutionId>> {
        let rows = sqlx::query("SELECT public_id FROM executions WHERE status IN ('pending', 'running', 'canceling')")
            .fetch_all(self.reader())
            .await?;
        rows.iter().map(|r| parse(&r.try_get::<String, _>("public_id")?)).collect()
    }

    /// Writes an execution's mutable columns, new tasks and new events in one transaction.
    ///
    /// This is the only write path of an execution: a round's expansion (its tasks, the
    /// transcript and the events that narrate it) is atomic.
    /// A `declaration` of `None` leaves the stored one as it is (a frozen declaration is written
    /// once).
    ///
    /// # Errors
    /// [`StoreError`] on a database failure; nothing is written then.
    pub async fn save_execution(
        &self,
        execution: &ExecutionRow,
        new_tasks: &[TaskRow],
        new_events: &[EventRow],
    ) -> StoreResult<()> {
        // Group-committed: answered once the batch holding this write is durable.
        let write = Arc::new((execution.clone(), new_tasks.to_vec(), new_events.to_vec()));
        let now = self.clock.now_ms();
        self.writer
            .write(move |connection| {
                let write = write.clone();
                Box::pin(async move {
                    let (execution, new_tasks, new_events) = &*write;
                    save_execution_in(connection, execution, new_tasks, new_events, now).await
                })
            })
            .await
    }

    /// Creates an execution of an input that already has one (a regeneration, `docs/executions.md`,
    /// "Control"):
    /// `execution` as given (normally `pending`, with its declaration frozen already) and its first
    /// `events`, in one transaction.
    ///
    /// # Errors
    /// [`StoreError`] on a database failure (an existing `public_id` among them); nothing is
    /// written then.
    pub async fn create_execution(&self, execution: &ExecutionRow, events: &[EventRow]) -> StoreResult<()> {
        let write = Arc::new((execution.clone(), events.to_vec()));
        self.writer
            .write(move |connection| {
                let write = write.clone();
                Box::pin(async move {
                    let (execution, events) = &*write;
                    sqlx::query(
                        "INSERT INTO executions (public_id, conversation_public_id, input_public_id, \
                         member_public_id, status, transcript, round, event_seq, created_at, updated_at) \
                         VALUES ($1, $2, $3, $4, $5, '[]', 0, 0, $6, $7)",
                    )
                    .bind(execution.public_id.to_string())
                    .bind(execution.conversation_public_id.to_string())
                    .bind(execution.input_public_id.to_string())
                    .bind(execution.member_public_id.to_string())
                    .bind(execution.status.as_str())
                    .bind(execution.created_at)
                    .bind(execution.created_at)
                    .execute(&mut *connection)
                    .await?;
                    save_execution_in(connection, execution, &[], events, execution.updated_at).await
                })
            })
            .await
    }

    /// Events after `after_seq`, oldest first, at most `limit`.
    ///
    /// # Errors
    /// [`StoreError`] on a database failure.
    pub async fn events_after(&self, execution: ExecutionId, after_seq: i64, limit: i64) -> StoreResult<Vec<EventRow>> {
        let rows = sqlx::query(
            "SELECT seq, type, data, at FROM events WHERE execution_public_id = $1 AND seq > $2 ORDER BY seq LIMIT $3",
        )
        .bind(execution.to_string())
        .bind(after_seq)
        .bind(limit)
        .fetch_all(self.reader())
        .await?;
        rows.iter()
            .map(|row| {
                let data = serde_json::from_str(&row.try_get::<String, _>("data")?)?;
                Ok(EventRow {
                    seq: row.try_get("seq")?,
                    event: Event::from_parts(&row.try_get::<String, _>("type")?, data)?,
                    at: row.try_get("at")?,
                })
            })
            .collect()
    }
}

/// [`Store::save_execution`]'s statements, on the writer's transaction.
async fn save_execution_in(
    connection: &mut AnyConnection,
    execution: &ExecutionRow,
    new_tasks: &[TaskRow],
    new_events: &[EventRow],
    now: i64,
) -> StoreResult<()> {
    sqlx::query(
        "UPDATE executions SET status = $1, attention_reason = $2, declaration = COALESCE($3, declaration), transcript = $4, round = $5, \
         final_text = $6, error_key = $7, event_seq = $8, updated_at = $9 WHERE public_id = $10",
    )
    .bind(execution.status.as_str())
    .bind(execution.attention_reason.map(|reason| reason.as_str()))
    .bind(execution.declaration.as_ref().map(Value::to_string))
    .bind(execution.transcript.to_string())
    .bind(execution.round)
    .bind(&execution.final_text)
    .bind(&execution.error_key)
    .bind(execution.event_seq)
    .bind(now)
    .bind(execution.public_id.to_string())
    .execute(&mut *connection)
    .await?;
    for task in new_tasks {
        insert_task(connection, task).await?;
    }
    for event in new_events {
        sqlx::query("INSERT INTO events (execution_public_id, seq, type, data, at) VALUES ($1, $2, $3, $4, $5)")
            .bind(execution.public_id.to_string())
            .bind(event.seq)
            .bind(event.event.event_type().as_str())
            .bind(event.event.data().to_string())
            .bind(event.at)
            .execute(&mut *connection)
            .await?;
    }
    Ok(())
}

/// [`Store::admit_input`]'s statements, on the writer's transaction.
async fn admit_input_in(
    connection: &mut AnyConnection,
    input: &InputRow,
    new_conversation: bool,
    execution_public_id: ExecutionId,
    now: i64,
) -> StoreResult<()> {
    if new_conversation {
        sqlx::query("INSERT INTO conversations (public_id, member_public_id, created_at) VALUES ($1, $2, $3)")
            .bind(input.conversation_public_id.to_string())
            .bind(input.member_public_id.to_string())
            .bind(now)
            .execute(&mut *connection)
            .await?;
    }
    sqlx::query(
        "INSERT INTO inputs (public_id, conversation_public_id, member_public_id, text, execution_declaration, \
         runner_executor_public_id, tool_names, created_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
    )
    .bind(input.public_id.to_string())
    .bind(input.conversation_public_id.to_string())
    .bind(input.member_public_id.to_string())
    .bind(&input.text)
    .bind(input.execution_declaration.as_ref().map(Value::to_string))
    .bind(input.runner_executor_public_id.map(|u| u.to_string()))
    .bind(input.tool_names.as_ref().map(Value::to_string))
    .bind(now)
    .execute(&mut *connection)
    .await?;
    sqlx::query(
        "INSERT INTO executions (public_id, conversation_public_id, input_public_id, member_public_id, status, \
         transcript, round, event_seq, created_at, updated_at) VALUES ($1, $2, $3, $4, 'pending', '[]', 0, 0, $5, $6)",
    )
    .bind(execution_public_id.to_string())
    .bind(input.conversation_public_id.to_string())
    .bind(input.public_id.to_string())
    .bind(input.member_public_id.to_string())
    .bind(now)
    .bind(now)
    .execute(&mut *connection)
    .await?;
    Ok(())
}
