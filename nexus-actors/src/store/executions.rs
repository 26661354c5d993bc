//! Conversations, inputs, executions, their transcripts and their event logs.

use std::sync::Arc;

use serde_json::Value;
use sqlx::{AnyConnection, Row};

use nexus_proto::{ConversationId, DeliveryMode, ExecutionId, InputId, MemberId, SteerOutcome};

use crate::model::ChatMessage;

use super::save_bytes::counted;
use super::tasks::insert_tasks;
use super::{
    Event, EventRow, ExecutionRow, InputRow, Store, StoreError, StoreResult, TaskRow, json_opt, json_typed, parse,
    parse_opt,
};

/// What a save writes of an execution's transcript, which the store holds one message per row
/// (`docs/architecture.md`, "Transcript storage"): only what changed since the last save.
#[derive(Clone, Copy, Debug)]
pub enum TranscriptWrite<'a> {
    /// The stored transcript stays as it is.
    Unchanged,
    /// The store keeps its first `kept` messages, and `messages` follow them: a save of a growing
    /// transcript. `kept` is 0 for a transcript the store holds none of per row yet (a new one,
    /// or one written whole before migration 0007).
    Append {
        /// The messages the store holds already, which stay as they are.
        kept: usize,
        /// The messages after them.
        messages: &'a [ChatMessage],
    },
    /// The transcript was rewritten after its first `kept` messages (a compaction): the stored
    /// messages after them are replaced by `messages`.
    Rewrite {
        /// The leading messages the rewrite left as they were.
        kept: usize,
        /// The messages after them.
        messages: &'a [ChatMessage],
    },
}

/// A [`TranscriptWrite`] ready for the writer: the new messages as JSON text.
#[derive(Debug)]
pub(super) struct TranscriptRows {
    kept: i64,
    messages: Vec<String>,
    /// Whether stored messages past `kept` are deleted first.
    rewrite: bool,
}

impl TranscriptRows {
    /// `None` for [`TranscriptWrite::Unchanged`].
    fn of(write: TranscriptWrite<'_>) -> StoreResult<Option<TranscriptRows>> {
        let (kept, messages, rewrite) = match write {
            TranscriptWrite::Unchanged => return Ok(None),
            TranscriptWrite::Append { kept, messages } => (kept, messages, false),
            TranscriptWrite::Rewrite { kept, messages } => (kept, messages, true),
        };
        let messages = messages.iter().map(serde_json::to_string).collect::<Result<Vec<_>, _>>()?;
        Ok(Some(TranscriptRows { kept: position(kept)?, messages, rewrite }))
    }

    /// The transcript's length once written.
    fn length(&self) -> StoreResult<i64> {
        Ok(self.kept + position(self.messages.len())?)
    }
}

/// Rows per INSERT of events and transcript messages (at most 5 parameters each).
const ROWS_PER_STATEMENT: usize = 200;

fn position(index: usize) -> StoreResult<i64> {
    i64::try_from(index).map_err(|_| StoreError::Corrupt(format!("transcript position {index} out of range")))
}

/// The row columns a save writes; the transcript's length and its legacy column ride along when
/// the transcript is written.
const UPDATE_EXECUTION: &str = "UPDATE executions SET status = $1, attention_reason = $2, \
    declaration = COALESCE($3, declaration), round = $4, final_text = $5, error_key = $6, event_seq = $7, \
    budget = $8, updated_at = $9 WHERE public_id = $10";
const UPDATE_EXECUTION_AND_TRANSCRIPT: &str = "UPDATE executions SET status = $1, attention_reason = $2, \
    declaration = COALESCE($3, declaration), round = $4, final_text = $5, error_key = $6, event_seq = $7, \
    budget = $8, updated_at = $9, transcript = '[]', transcript_length = $10 WHERE public_id = $11";

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
             tool_names, posted_by_public_id, turn, variables, deliver_at, budget FROM inputs WHERE public_id = $1",
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
                posted_by_public_id: parse_opt(row.try_get("posted_by_public_id")?)?,
                turn: row.try_get("turn")?,
                variables: json_opt(row.try_get("variables")?)?,
                deliver_at: row.try_get("deliver_at")?,
                budget: json_typed(row.try_get("budget")?)?,
            })
        })
        .transpose()
    }

    /// Reads an execution.
    ///
    /// # Errors
    /// [`StoreError`] on a database failure.
    pub async fn execution(&self, public_id: ExecutionId) -> StoreResult<Option<ExecutionRow>> {
        // The row and its messages are read in one snapshot, so a save committed in between is
        // seen whole or not at all, as when the transcript was a column of the row.
        let mut snapshot = self.reader().begin_with(self.backend.snapshot_sql()).await?;
        let row = sqlx::query(
            "SELECT conversation_public_id, input_public_id, member_public_id, status, attention_reason, declaration, \
             transcript, transcript_length, round, final_text, error_key, event_seq, budget, created_at, updated_at, \
             parent_execution_public_id FROM executions WHERE public_id = $1",
        )
        .bind(public_id.to_string())
        .fetch_optional(&mut *snapshot)
        .await?;
        let Some(row) = row else {
            snapshot.commit().await?;
            return Ok(None);
        };
        let length: i64 = row.try_get("transcript_length")?;
        let (transcript, transcript_stored) = match length {
            // Written whole before migration 0007 (or empty): the legacy column holds it.
            0 => (serde_json::from_str(&row.try_get::<String, _>("transcript")?)?, 0),
            _ => {
                let messages = transcript_in(&mut snapshot, public_id, length).await?;
                let stored = messages.len();
                (Value::Array(messages), stored)
            }
        };
        snapshot.commit().await?;
        Ok(Some(ExecutionRow {
            public_id,
            conversation_public_id: parse(&row.try_get::<String, _>("conversation_public_id")?)?,
            input_public_id: parse(&row.try_get::<String, _>("input_public_id")?)?,
            member_public_id: parse(&row.try_get::<String, _>("member_public_id")?)?,
            status: parse(&row.try_get::<String, _>("status")?)?,
            attention_reason: parse_opt(row.try_get("attention_reason")?)?,
            declaration: json_opt(row.try_get("declaration")?)?,
            transcript,
            transcript_stored,
            round: row.try_get("round")?,
            final_text: row.try_get("final_text")?,
            error_key: row.try_get("error_key")?,
            event_seq: row.try_get("event_seq")?,
            budget: json_typed(row.try_get("budget")?)?,
            created_at: row.try_get("created_at")?,
            updated_at: row.try_get("updated_at")?,
            parent_execution_public_id: parse_opt(row.try_get("parent_execution_public_id")?)?,
        }))
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

    /// Writes an execution's mutable columns, what changed of its transcript, new tasks and new
    /// events in one transaction.
    ///
    /// This is the only write path of an execution: a round's expansion (its tasks, the
    /// transcript and the events that narrate it) is atomic. The row's own `transcript` is not
    /// read: `transcript` says what to write of it, so a save writes what is new, not the whole
    /// history (`docs/architecture.md`, "Transcript storage").
    /// A `declaration` of `None` leaves the stored one as it is (a frozen declaration is written
    /// once).
    ///
    /// # Errors
    /// [`StoreError`] on a database failure; nothing is written then.
    pub async fn save_execution(
        &self,
        execution: &ExecutionRow,
        transcript: TranscriptWrite<'_>,
        new_tasks: &[TaskRow],
        new_events: &[EventRow],
    ) -> StoreResult<()> {
        self.save_execution_applying(execution, transcript, new_tasks, new_events, &[], &[]).await
    }

    /// [`Store::save_execution`], also marking the `steer` inputs `applied` (each with the round
    /// whose request first carries it) applied by this execution, in the same transaction (`docs/executions.md`,
    /// "Conversations: one turn at a time"). Each mark is a compare-and-set from an unapplied
    /// steer; one that was disposed of meanwhile is left as it is.
    ///
    /// # Errors
    /// [`StoreError`] on a database failure; nothing is written then.
    pub async fn save_execution_applying(
        &self,
        execution: &ExecutionRow,
        transcript: TranscriptWrite<'_>,
        new_tasks: &[TaskRow],
        new_events: &[EventRow],
        applied: &[(InputId, i64)],
        consumed: &[super::children::Consumption],
    ) -> StoreResult<()> {
        let transcript = TranscriptRows::of(transcript)?;
        let row = without_transcript(execution);
        // Group-committed: answered once the batch holding this write is durable.
        let write =
            Arc::new((row, transcript, new_tasks.to_vec(), new_events.to_vec(), applied.to_vec(), consumed.to_vec()));
        let now = self.clock.now_ms();
        let bytes = self
            .writer
            .write(move |connection| {
                let write = write.clone();
                Box::pin(async move {
                    let (execution, transcript, new_tasks, new_events, applied, consumed) = &*write;
                    let bytes =
                        save_execution_in(connection, execution, transcript.as_ref(), new_tasks, new_events, now)
                            .await?;
                    super::queue::mark_applied(connection, applied, execution.public_id).await?;
                    // Children whose results this save hands to the model ([`super::children`]).
                    super::children::consume_in(connection, consumed, now).await?;
                    Ok(bytes)
                })
            })
            .await?;
        self.saves.record(execution.public_id, execution.round, bytes);
        Ok(())
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
                    insert_execution_in(connection, execution).await?;
                    save_execution_in(connection, execution, None, &[], events, execution.updated_at).await?;
                    Ok(())
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

/// [`Store::save_execution`]'s statements, on the writer's transaction. Answers the bytes of text
/// they bound ([`Store::save_bytes`]).
pub(super) async fn save_execution_in(
    connection: &mut AnyConnection,
    execution: &ExecutionRow,
    transcript: Option<&TranscriptRows>,
    new_tasks: &[TaskRow],
    new_events: &[EventRow],
    now: i64,
) -> StoreResult<u64> {
    let mut bytes = 0;
    let public_id = execution.public_id.to_string();
    let declaration = execution.declaration.as_ref().map(Value::to_string);
    let budget = execution.budget.as_ref().map(serde_json::to_string).transpose()?;
    let update = match transcript {
        Some(_) => UPDATE_EXECUTION_AND_TRANSCRIPT,
        None => UPDATE_EXECUTION,
    };
    let mut update = sqlx::query(update)
        .bind(counted(&mut bytes, execution.status.as_str()))
        .bind(counted(&mut bytes, execution.attention_reason.map(|reason| reason.as_str())))
        .bind(counted(&mut bytes, &declaration))
        .bind(execution.round)
        .bind(counted(&mut bytes, &execution.final_text))
        .bind(counted(&mut bytes, &execution.error_key))
        .bind(execution.event_seq)
        .bind(counted(&mut bytes, &budget))
        .bind(now);
    if let Some(transcript) = transcript {
        update = update.bind(transcript.length()?);
    }
    update.bind(counted(&mut bytes, &public_id)).execute(&mut *connection).await?;
    if let Some(transcript) = transcript {
        if transcript.rewrite {
            sqlx::query("DELETE FROM transcript_messages WHERE execution_public_id = $1 AND position >= $2")
                .bind(counted(&mut bytes, &public_id))
                .bind(transcript.kept)
                .execute(&mut *connection)
                .await?;
        }
        // Many rows to a statement: a save costs a few statements however much it writes.
        let mut start = 0;
        for chunk in transcript.messages.chunks(ROWS_PER_STATEMENT) {
            let sql = format!(
                "INSERT INTO transcript_messages (execution_public_id, position, message) VALUES {}",
                super::values_list(chunk.len(), 3)
            );
            let mut query = sqlx::query(sqlx::AssertSqlSafe(sql));
            for (offset, message) in chunk.iter().enumerate() {
                query = query
                    .bind(counted(&mut bytes, &public_id))
                    .bind(transcript.kept + position(start + offset)?)
                    .bind(counted(&mut bytes, message));
            }
            query.execute(&mut *connection).await?;
            start += chunk.len();
        }
    }
    bytes += insert_tasks(connection, new_tasks).await?;
    for chunk in new_events.chunks(ROWS_PER_STATEMENT) {
        let sql = format!(
            "INSERT INTO events (execution_public_id, seq, type, data, at) VALUES {}",
            super::values_list(chunk.len(), 5)
        );
        let mut query = sqlx::query(sqlx::AssertSqlSafe(sql));
        for event in chunk {
            query = query
                .bind(counted(&mut bytes, &public_id))
                .bind(event.seq)
                .bind(counted(&mut bytes, event.event.event_type().as_str()))
                .bind(counted(&mut bytes, event.event.data().to_string()))
                .bind(event.at);
        }
        query.execute(&mut *connection).await?;
    }
    Ok(bytes)
}

/// `row` without its transcript, which the writer never reads: a save does not copy the history.
fn without_transcript(row: &ExecutionRow) -> ExecutionRow {
    ExecutionRow {
        public_id: row.public_id,
        conversation_public_id: row.conversation_public_id,
        input_public_id: row.input_public_id,
        member_public_id: row.member_public_id,
        status: row.status,
        attention_reason: row.attention_reason,
        declaration: row.declaration.clone(),
        transcript: Value::Null,
        transcript_stored: 0,
        round: row.round,
        final_text: row.final_text.clone(),
        error_key: row.error_key.clone(),
        event_seq: row.event_seq,
        budget: row.budget.clone(),
        created_at: row.created_at,
        updated_at: row.updated_at,
        parent_execution_public_id: row.parent_execution_public_id,
    }
}

/// The `length` messages of an execution's transcript, in order, read on `connection`.
async fn transcript_in(connection: &mut AnyConnection, execution: ExecutionId, length: i64) -> StoreResult<Vec<Value>> {
    let rows = sqlx::query(
        "SELECT position, message FROM transcript_messages WHERE execution_public_id = $1 AND position < $2 \
         ORDER BY position",
    )
    .bind(execution.to_string())
    .bind(length)
    .fetch_all(&mut *connection)
    .await?;
    let mut messages = Vec::with_capacity(rows.len());
    for (index, row) in rows.iter().enumerate() {
        let at: i64 = row.try_get("position")?;
        if at != position(index)? {
            return Err(StoreError::Corrupt(format!("execution {execution}: transcript message {index} is missing")));
        }
        messages.push(serde_json::from_str(&row.try_get::<String, _>("message")?)?);
    }
    if position(messages.len())? != length {
        return Err(StoreError::Corrupt(format!(
            "execution {execution}: transcript has {} of its {length} messages",
            messages.len()
        )));
    }
    Ok(messages)
}

/// Inserts `execution`'s row as created (no transcript, round 0, no events yet), on the writer's
/// transaction: a regeneration's, or a waiting steer's that becomes a turn.
pub(super) async fn insert_execution_in(connection: &mut AnyConnection, execution: &ExecutionRow) -> StoreResult<()> {
    sqlx::query(
        "INSERT INTO executions (public_id, conversation_public_id, input_public_id, member_public_id, status, \
         transcript, round, event_seq, budget, created_at, updated_at, parent_execution_public_id) \
         VALUES ($1, $2, $3, $4, $5, '[]', 0, 0, $6, $7, $8, $9)",
    )
    .bind(execution.public_id.to_string())
    .bind(execution.conversation_public_id.to_string())
    .bind(execution.input_public_id.to_string())
    .bind(execution.member_public_id.to_string())
    .bind(execution.status.as_str())
    .bind(execution.budget.as_ref().map(serde_json::to_string).transpose()?)
    .bind(execution.created_at)
    .bind(execution.created_at)
    .bind(execution.parent_execution_public_id.map(|id| id.to_string()))
    .execute(&mut *connection)
    .await?;
    Ok(())
}

/// [`Store::admit_input`]'s statements, on the writer's transaction: the input as a `queue` turn
/// with its pending execution.
async fn admit_input_in(
    connection: &mut AnyConnection,
    input: &InputRow,
    new_conversation: bool,
    execution_public_id: ExecutionId,
    now: i64,
) -> StoreResult<()> {
    admit_delivered_in(connection, input, new_conversation, Some(execution_public_id), DeliveryMode::Queue, now).await
}

/// Inserts the conversation when new, the input delivered as `mode`, and its pending execution
/// when it has one (a steer into a live execution has none: `docs/executions.md`,
/// "Conversations: one turn at a time"), on the writer's transaction.
pub(super) async fn admit_delivered_in(
    connection: &mut AnyConnection,
    input: &InputRow,
    new_conversation: bool,
    execution_public_id: Option<ExecutionId>,
    mode: DeliveryMode,
    now: i64,
) -> StoreResult<()> {
    // A steer that has its own execution is a turn from the start.
    let outcome = (mode == DeliveryMode::Steer && execution_public_id.is_some()).then_some(SteerOutcome::Turn);
    if new_conversation {
        sqlx::query("INSERT INTO conversations (public_id, member_public_id, created_at) VALUES ($1, $2, $3)")
            .bind(input.conversation_public_id.to_string())
            .bind(input.member_public_id.to_string())
            .bind(now)
            .execute(&mut *connection)
            .await?;
    }
    // The next turn of the conversation; the unique (conversation, turn) index refuses a second
    // writer that read the same maximum.
    sqlx::query(
        "INSERT INTO inputs (public_id, conversation_public_id, member_public_id, text, execution_declaration, \
         runner_executor_public_id, tool_names, created_at, posted_by_public_id, delivery_mode, steer_outcome, variables, \
         deliver_at, delivered_at, budget, turn) \
         SELECT $1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, COALESCE(MAX(turn), 0) + 1 FROM inputs \
         WHERE conversation_public_id = $2",
    )
    .bind(input.public_id.to_string())
    .bind(input.conversation_public_id.to_string())
    .bind(input.member_public_id.to_string())
    .bind(&input.text)
    .bind(input.execution_declaration.as_ref().map(Value::to_string))
    .bind(input.runner_executor_public_id.map(|u| u.to_string()))
    .bind(input.tool_names.as_ref().map(Value::to_string))
    .bind(now)
    .bind(input.posted_by_public_id.map(|m| m.to_string()))
    .bind(mode.as_str())
    .bind(outcome.map(SteerOutcome::as_str))
    .bind(input.variables.as_ref().map(Value::to_string))
    .bind(input.deliver_at)
    // A time already come is delivered at admission: it joins the line at once
    // (`docs/executions.md`, "Scheduled inputs").
    .bind(input.deliver_at.filter(|at| *at <= now).map(|_| now))
    .bind(input.budget.as_ref().map(serde_json::to_string).transpose()?)
    .execute(&mut *connection)
    .await?;
    let Some(execution_public_id) = execution_public_id else { return Ok(()) };
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
