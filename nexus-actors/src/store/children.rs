//! The parent–child relation of delegation (`docs/delegation.md`, "Durability"): one row per
//! child an execution started (`delegate_task` or `spawn`), keyed by the parent and the call that
//! started it. The row is written with the child's conversation, input and execution in one
//! transaction, before the parent acts on it; it records who consumed the child's result (exactly
//! once: a wait or a join of the parent, the parent's next boundary, a mail turn, or the end that
//! canceled it) and what became of the child when its parent stopped waiting for it. The child's
//! status and result are read from its own execution row, so they can never disagree with it.

use std::sync::Arc;

use sqlx::Row;
use sqlx::any::AnyRow;

use nexus_proto::{
    ChildDisposition, ChildKind, ChildLifetime, ChildWake, ConversationId, DeliveryMode, ExecutionId, RunStatus,
    TaskKey,
};

use super::executions::{admit_delivered_in, insert_execution_in, save_execution_in};
use super::{EventRow, ExecutionRow, InputRow, Store, StoreResult, parse, parse_opt};

/// The most characters of a child's prompt its row keeps, for the `<prompt>` of its
/// `<task_result>` envelope (REFERENCE 5, "Result envelope").
pub const PROMPT_HEAD_CHARS: usize = 80;

/// One child of an execution, with its execution's status and result.
#[derive(Clone, Debug, PartialEq)]
pub struct ChildRow {
    /// The parent execution.
    pub parent_execution_public_id: ExecutionId,
    /// The parent's call that started it: the handle `wait`, `join` and the doors name it by.
    pub task_key: TaskKey,
    /// The parent's conversation, the child conversation's parent.
    pub parent_conversation_public_id: ConversationId,
    /// `delegate` or `spawn`.
    pub kind: ChildKind,
    /// The child's own conversation.
    pub child_conversation_public_id: ConversationId,
    /// The child's (first) execution.
    pub child_execution_public_id: ExecutionId,
    /// Whether it may outlive the parent's turn.
    pub lifetime: ChildLifetime,
    /// What its result does once the parent's turn has ended.
    pub wake: ChildWake,
    /// A spawned child conversation's label, unique per parent conversation.
    pub label: Option<String>,
    /// The prompt's first [`PROMPT_HEAD_CHARS`] characters.
    pub prompt_head: String,
    /// Who consumed its result: `task:<key>` (a wait or join of the parent), `execution:<id>`
    /// (read at a boundary or a turn's start), `input:<id>` (a mail turn), `end:<id>` (canceled
    /// with the parent's turn); `None` until then.
    pub consumed_by: Option<String>,
    /// When, Unix milliseconds.
    pub consumed_at: Option<i64>,
    /// What became of it when its parent stopped waiting for it, if anything did.
    pub disposition: Option<ChildDisposition>,
    /// Who a detached child answers to (`conversation:<id>`).
    pub owner: Option<String>,
    /// Creation time, Unix milliseconds.
    pub created_at: i64,
    /// The child execution's status (read from its row).
    pub status: RunStatus,
    /// Its final answer, once completed.
    pub final_text: Option<String>,
    /// Its failure key, when it ended on one.
    pub error_key: Option<String>,
    /// Its budget ledger, when it has one (`docs/delegation.md`, "Budgets").
    pub budget: Option<crate::budget::BudgetLedger>,
}

impl ChildRow {
    /// Whether the child execution has ended.
    #[must_use]
    pub fn ended(&self) -> bool {
        self.status.is_terminal()
    }

    /// Whether it ended with an answer (the only success).
    #[must_use]
    pub fn succeeded(&self) -> bool {
        self.status == RunStatus::Completed
    }

    /// The `<task_result status=…>` word of an ended child (REFERENCE 5): `completed`, `failed`
    /// (ended on a failure key) or `canceled`; `running` while it has not ended.
    #[must_use]
    pub fn result_status(&self) -> &'static str {
        match (self.status, self.error_key.as_deref()) {
            (RunStatus::Completed, _) => "completed",
            (RunStatus::Canceled, Some(key)) if key != "run_canceled" && key != "join_loser_canceled" => "failed",
            (RunStatus::Canceled, _) => "canceled",
            _ => "running",
        }
    }
}

/// One consumption a save writes with the execution (`Store::save_execution_applying`): the
/// child `task_key` of `parent`, consumed by `by`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Consumption {
    /// The child's parent.
    pub parent: ExecutionId,
    /// The child.
    pub task_key: TaskKey,
    /// Who consumes it ([`ChildRow::consumed_by`]).
    pub by: String,
}

const COLUMNS: &str = "c.parent_execution_public_id, c.task_key, c.parent_conversation_public_id, c.kind, \
     c.child_conversation_public_id, c.child_execution_public_id, c.lifetime, c.wake, c.label, c.prompt_head, \
     c.consumed_by, c.consumed_at, c.disposition, c.owner, c.created_at, e.status, e.final_text, e.error_key, e.budget \
     FROM children c JOIN executions e ON e.public_id = c.child_execution_public_id";

fn child_of(row: &AnyRow) -> StoreResult<ChildRow> {
    Ok(ChildRow {
        parent_execution_public_id: parse(&row.try_get::<String, _>("parent_execution_public_id")?)?,
        task_key: parse(&row.try_get::<String, _>("task_key")?)?,
        parent_conversation_public_id: parse(&row.try_get::<String, _>("parent_conversation_public_id")?)?,
        kind: parse(&row.try_get::<String, _>("kind")?)?,
        child_conversation_public_id: parse(&row.try_get::<String, _>("child_conversation_public_id")?)?,
        child_execution_public_id: parse(&row.try_get::<String, _>("child_execution_public_id")?)?,
        lifetime: parse(&row.try_get::<String, _>("lifetime")?)?,
        wake: parse(&row.try_get::<String, _>("wake")?)?,
        label: row.try_get("label")?,
        prompt_head: row.try_get("prompt_head")?,
        consumed_by: row.try_get("consumed_by")?,
        consumed_at: row.try_get("consumed_at")?,
        disposition: parse_opt(row.try_get("disposition")?)?,
        owner: row.try_get("owner")?,
        created_at: row.try_get("created_at")?,
        status: parse(&row.try_get::<String, _>("status")?)?,
        final_text: row.try_get("final_text")?,
        error_key: row.try_get("error_key")?,
        budget: row.try_get::<Option<String>, _>("budget")?.map(|text| serde_json::from_str(&text)).transpose()?,
    })
}

/// Marks each of `consumed` consumed, on the writer's transaction: a compare-and-set from
/// unconsumed, so a result is consumed once and the first consumer keeps it.
pub(super) async fn consume_in(
    connection: &mut sqlx::AnyConnection,
    consumed: &[Consumption],
    now: i64,
) -> StoreResult<()> {
    for mark in consumed {
        sqlx::query(
            "UPDATE children SET consumed_by = $1, consumed_at = $2 \
             WHERE parent_execution_public_id = $3 AND task_key = $4 AND consumed_by IS NULL",
        )
        .bind(&mark.by)
        .bind(now)
        .bind(mark.parent.to_string())
        .bind(mark.task_key.to_string())
        .execute(&mut *connection)
        .await?;
    }
    Ok(())
}

impl Store {
    /// Starts a child: creates its conversation (child of the parent's, with `child.label`), its
    /// input (turn 1), its pending execution (`execution`, its declaration frozen already when it
    /// has one) with its first `events`, and the parent–child row, in one transaction.
    /// Idempotent on the parent's call: when that call already started a child, nothing is written
    /// and the existing child is answered (`false`); otherwise the new one (`true`).
    ///
    /// # Errors
    /// [`StoreError`](super::StoreError) on a database failure; nothing is written then.
    pub async fn start_child(
        &self,
        child: &ChildRow,
        input: &InputRow,
        execution: &ExecutionRow,
        events: &[EventRow],
    ) -> StoreResult<(ChildRow, bool)> {
        if let Some(existing) = self.child(child.parent_execution_public_id, child.task_key).await? {
            return Ok((existing, false));
        }
        let write = Arc::new((child.clone(), input.clone(), execution.clone(), events.to_vec()));
        let now = self.clock.now_ms();
        let created = self
            .writer
            .write(move |connection| {
                let write = write.clone();
                Box::pin(async move {
                    let (child, input, execution, events) = &*write;
                    let exists =
                        sqlx::query("SELECT 1 FROM children WHERE parent_execution_public_id = $1 AND task_key = $2")
                            .bind(child.parent_execution_public_id.to_string())
                            .bind(child.task_key.to_string())
                            .fetch_optional(&mut *connection)
                            .await?;
                    if exists.is_some() {
                        return Ok(false);
                    }
                    sqlx::query(
                        "INSERT INTO conversations (public_id, member_public_id, created_at, \
                         parent_conversation_public_id, label) VALUES ($1, $2, $3, $4, $5)",
                    )
                    .bind(child.child_conversation_public_id.to_string())
                    .bind(input.member_public_id.to_string())
                    .bind(now)
                    .bind(child.parent_conversation_public_id.to_string())
                    .bind(&child.label)
                    .execute(&mut *connection)
                    .await?;
                    admit_delivered_in(connection, input, false, None, DeliveryMode::Queue, now).await?;
                    insert_execution_in(connection, execution).await?;
                    save_execution_in(connection, execution, None, &[], events, now).await?;
                    sqlx::query(
                        "INSERT INTO children (parent_execution_public_id, task_key, parent_conversation_public_id, \
                         kind, child_conversation_public_id, child_execution_public_id, lifetime, wake, label, \
                         prompt_head, created_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)",
                    )
                    .bind(child.parent_execution_public_id.to_string())
                    .bind(child.task_key.to_string())
                    .bind(child.parent_conversation_public_id.to_string())
                    .bind(child.kind.as_str())
                    .bind(child.child_conversation_public_id.to_string())
                    .bind(child.child_execution_public_id.to_string())
                    .bind(child.lifetime.as_str())
                    .bind(child.wake.as_str())
                    .bind(&child.label)
                    .bind(&child.prompt_head)
                    .bind(now)
                    .execute(&mut *connection)
                    .await?;
                    Ok(true)
                })
            })
            .await?;
        let stored = self
            .child(child.parent_execution_public_id, child.task_key)
            .await?
            .ok_or_else(|| super::StoreError::Corrupt(format!("child {} was not written", child.task_key)))?;
        Ok((stored, created))
    }

    /// The child the parent's call `task_key` started, if any.
    ///
    /// # Errors
    /// [`StoreError`](super::StoreError) on a database failure.
    pub async fn child(&self, parent: ExecutionId, task_key: TaskKey) -> StoreResult<Option<ChildRow>> {
        let row = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT {COLUMNS} WHERE c.parent_execution_public_id = $1 AND c.task_key = $2"
        )))
        .bind(parent.to_string())
        .bind(task_key.to_string())
        .fetch_optional(self.reader())
        .await?;
        row.as_ref().map(child_of).transpose()
    }

    /// Every child of `parent`, oldest first.
    ///
    /// # Errors
    /// [`StoreError`](super::StoreError) on a database failure.
    pub async fn children_of(&self, parent: ExecutionId) -> StoreResult<Vec<ChildRow>> {
        let rows = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT {COLUMNS} WHERE c.parent_execution_public_id = $1 ORDER BY c.created_at, c.task_key"
        )))
        .bind(parent.to_string())
        .fetch_all(self.reader())
        .await?;
        rows.iter().map(child_of).collect()
    }

    /// The row that made `child` a child, if it is one.
    ///
    /// # Errors
    /// [`StoreError`](super::StoreError) on a database failure.
    pub async fn parent_of(&self, child: ExecutionId) -> StoreResult<Option<ChildRow>> {
        let row = sqlx::query(sqlx::AssertSqlSafe(format!("SELECT {COLUMNS} WHERE c.child_execution_public_id = $1")))
            .bind(child.to_string())
            .fetch_optional(self.reader())
            .await?;
        row.as_ref().map(child_of).transpose()
    }

    /// The children of `conversation`'s executions that ended and whose results nobody consumed
    /// yet, with `wake: passive`: the mail the conversation's next turn reads first.
    ///
    /// # Errors
    /// [`StoreError`](super::StoreError) on a database failure.
    pub async fn passive_mail(&self, conversation: ConversationId) -> StoreResult<Vec<ChildRow>> {
        let rows = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT {COLUMNS} WHERE c.parent_conversation_public_id = $1 AND c.consumed_by IS NULL \
             AND c.wake = 'passive' AND e.status IN ('completed', 'canceled') ORDER BY c.created_at, c.task_key"
        )))
        .bind(conversation.to_string())
        .fetch_all(self.reader())
        .await?;
        rows.iter().map(child_of).collect()
    }

    /// Marks each of `consumed` consumed (compare-and-set from unconsumed). Answers how many
    /// marks this write made.
    ///
    /// # Errors
    /// [`StoreError`](super::StoreError) on a database failure.
    pub async fn consume_children(&self, consumed: &[Consumption]) -> StoreResult<()> {
        let consumed = Arc::new(consumed.to_vec());
        let now = self.clock.now_ms();
        self.writer
            .write(move |connection| {
                let consumed = consumed.clone();
                Box::pin(async move { consume_in(connection, &consumed, now).await })
            })
            .await
    }

    /// Records what became of a child its parent no longer waits for (`disposition`, with the
    /// owner of a detached child), once: a child already disposed of keeps its first record.
    /// A canceled child is consumed by `consumed_by` in the same write (its result is nobody's
    /// mail).
    ///
    /// # Errors
    /// [`StoreError`](super::StoreError) on a database failure.
    pub async fn dispose_child(
        &self,
        parent: ExecutionId,
        task_key: TaskKey,
        disposition: ChildDisposition,
        owner: Option<String>,
        consumed_by: Option<String>,
    ) -> StoreResult<bool> {
        let now = self.clock.now_ms();
        self.writer
            .write(move |connection| {
                let owner = owner.clone();
                let consumed_by = consumed_by.clone();
                Box::pin(async move {
                    let written = sqlx::query(
                        "UPDATE children SET disposition = $1, owner = $2 \
                         WHERE parent_execution_public_id = $3 AND task_key = $4 AND disposition IS NULL",
                    )
                    .bind(disposition.as_str())
                    .bind(&owner)
                    .bind(parent.to_string())
                    .bind(task_key.to_string())
                    .execute(&mut *connection)
                    .await?;
                    if let Some(by) = consumed_by {
                        consume_in(connection, &[Consumption { parent, task_key, by }], now).await?;
                    }
                    Ok(written.rows_affected() == 1)
                })
            })
            .await
    }

    /// Delivers an ended child's result as a mail turn of the parent's conversation: consumes the
    /// child by `input:<id>` and admits `input` (queued) with its pending `execution` (the
    /// parent's declaration frozen on it), in one transaction. Answers `false`, writing nothing,
    /// when the child was consumed already.
    ///
    /// # Errors
    /// [`StoreError`](super::StoreError) on a database failure; nothing is written then.
    pub async fn mail_child(&self, child: &ChildRow, input: &InputRow, execution: &ExecutionRow) -> StoreResult<bool> {
        let write = Arc::new((child.clone(), input.clone(), execution.clone()));
        let now = self.clock.now_ms();
        self.writer
            .write(move |connection| {
                let write = write.clone();
                Box::pin(async move {
                    let (child, input, execution) = &*write;
                    let marked = sqlx::query(
                        "UPDATE children SET consumed_by = $1, consumed_at = $2 \
                         WHERE parent_execution_public_id = $3 AND task_key = $4 AND consumed_by IS NULL",
                    )
                    .bind(format!("input:{}", input.public_id))
                    .bind(now)
                    .bind(child.parent_execution_public_id.to_string())
                    .bind(child.task_key.to_string())
                    .execute(&mut *connection)
                    .await?;
                    if marked.rows_affected() == 0 {
                        return Ok(false);
                    }
                    admit_delivered_in(connection, input, false, None, DeliveryMode::Queue, now).await?;
                    insert_execution_in(connection, execution).await?;
                    save_execution_in(connection, execution, None, &[], &[], now).await?;
                    Ok(true)
                })
            })
            .await
    }

    /// The parents recovery must look at again: those with an ended child nobody consumed, and
    /// ended parents with a live child they have not disposed of (`docs/delegation.md`,
    /// "Durability").
    ///
    /// # Errors
    /// [`StoreError`](super::StoreError) on a database failure.
    pub async fn parents_to_reconcile(&self) -> StoreResult<Vec<ExecutionId>> {
        let rows = sqlx::query(
            "SELECT DISTINCT c.parent_execution_public_id FROM children c \
             JOIN executions e ON e.public_id = c.child_execution_public_id \
             JOIN executions p ON p.public_id = c.parent_execution_public_id \
             WHERE (c.consumed_by IS NULL AND e.status IN ('completed', 'canceled')) \
                OR (c.disposition IS NULL AND p.status IN ('completed', 'canceled') \
                    AND e.status NOT IN ('completed', 'canceled'))",
        )
        .fetch_all(self.reader())
        .await?;
        rows.iter().map(|row| parse(&row.try_get::<String, _>("parent_execution_public_id")?)).collect()
    }

    /// The children recorded `canceled` (a join's loser, a `lifetime: turn` child at its parent's
    /// end) whose executions have not ended: the node died between the record and the child's
    /// stop, which recovery therefore makes again (`docs/delegation.md`, "Durability").
    ///
    /// # Errors
    /// [`StoreError`](super::StoreError) on a database failure.
    pub async fn canceled_children_still_live(&self) -> StoreResult<Vec<ExecutionId>> {
        let rows = sqlx::query(
            "SELECT c.child_execution_public_id FROM children c \
             JOIN executions e ON e.public_id = c.child_execution_public_id \
             WHERE c.disposition = 'canceled' AND e.status NOT IN ('completed', 'canceled')",
        )
        .fetch_all(self.reader())
        .await?;
        rows.iter().map(|row| parse(&row.try_get::<String, _>("child_execution_public_id")?)).collect()
    }

    /// Whether `label` names a child conversation of `conversation` already.
    ///
    /// # Errors
    /// [`StoreError`](super::StoreError) on a database failure.
    pub async fn child_label_taken(&self, conversation: ConversationId, label: &str) -> StoreResult<bool> {
        let row = sqlx::query("SELECT 1 FROM conversations WHERE parent_conversation_public_id = $1 AND label = $2")
            .bind(conversation.to_string())
            .bind(label)
            .fetch_optional(self.reader())
            .await?;
        Ok(row.is_some())
    }

    /// The descendants of `conversation` (children, their children, ...), breadth first, at most
    /// `limit` of them: the `subtree` reach beyond the conversation itself.
    ///
    /// # Errors
    /// [`StoreError`](super::StoreError) on a database failure.
    pub async fn descendant_conversations(
        &self,
        conversation: ConversationId,
        limit: usize,
    ) -> StoreResult<Vec<ConversationId>> {
        let mut found = Vec::new();
        let mut frontier = vec![conversation];
        while let Some(next) = frontier.pop() {
            let rows = sqlx::query("SELECT public_id FROM conversations WHERE parent_conversation_public_id = $1")
                .bind(next.to_string())
                .fetch_all(self.reader())
                .await?;
            for row in &rows {
                let id: ConversationId = parse(&row.try_get::<String, _>("public_id")?)?;
                if found.len() >= limit {
                    return Ok(found);
                }
                found.push(id);
                frontier.push(id);
            }
        }
        Ok(found)
    }
}

impl Store {
    /// The children `spawn` started from executions of `conversation`, oldest first: the
    /// conversations `send`, `status` and `cancel` address.
    ///
    /// # Errors
    /// [`StoreError`](super::StoreError) on a database failure.
    pub async fn spawned_children(&self, conversation: ConversationId) -> StoreResult<Vec<ChildRow>> {
        let rows = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT {COLUMNS} WHERE c.parent_conversation_public_id = $1 AND c.kind = 'spawn' \
             ORDER BY c.created_at, c.task_key"
        )))
        .bind(conversation.to_string())
        .fetch_all(self.reader())
        .await?;
        rows.iter().map(child_of).collect()
    }

    /// The input `execution` answers.
    ///
    /// # Errors
    /// [`StoreError`](super::StoreError) on a database failure.
    pub async fn input_of_execution(&self, execution: ExecutionId) -> StoreResult<Option<InputRow>> {
        let row = sqlx::query("SELECT input_public_id FROM executions WHERE public_id = $1")
            .bind(execution.to_string())
            .fetch_optional(self.reader())
            .await?;
        match row {
            Some(row) => self.input(parse(&row.try_get::<String, _>("input_public_id")?)?).await,
            None => Ok(None),
        }
    }

    /// The newest execution of `conversation` (its latest turn's newest candidate): its id,
    /// status, final text and error key, read in one narrow query (no transcript).
    ///
    /// # Errors
    /// [`StoreError`](super::StoreError) on a database failure.
    pub async fn latest_execution_of(&self, conversation: ConversationId) -> StoreResult<Option<LatestExecution>> {
        let row = sqlx::query(
            "SELECT e.public_id, e.status, e.final_text, e.error_key FROM executions e \
             JOIN inputs i ON i.public_id = e.input_public_id \
             WHERE e.conversation_public_id = $1 ORDER BY i.turn DESC, e.created_at DESC LIMIT 1",
        )
        .bind(conversation.to_string())
        .fetch_optional(self.reader())
        .await?;
        row.map(|row| {
            Ok(LatestExecution {
                public_id: parse(&row.try_get::<String, _>("public_id")?)?,
                status: parse(&row.try_get::<String, _>("status")?)?,
                final_text: row.try_get("final_text")?,
                error_key: row.try_get("error_key")?,
            })
        })
        .transpose()
    }

    /// How many children `parent` has started, counted in the database.
    ///
    /// # Errors
    /// [`StoreError`](super::StoreError) on a database failure.
    pub async fn children_count(&self, parent: ExecutionId) -> StoreResult<usize> {
        let count: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM children WHERE parent_execution_public_id = $1")
            .bind(parent.to_string())
            .fetch_one(self.reader())
            .await?;
        Ok(usize::try_from(count).unwrap_or(usize::MAX))
    }
}

/// What [`Store::latest_execution_of`] reads of a conversation's newest execution.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LatestExecution {
    /// Its id.
    pub public_id: ExecutionId,
    /// Its status.
    pub status: nexus_proto::RunStatus,
    /// Its final answer, once it has one.
    pub final_text: Option<String>,
    /// Its error key, when it failed.
    pub error_key: Option<String>,
}
