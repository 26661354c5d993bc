//! Tasks: the inbox rows, their claims and their settlements.

/// The task columns, as a literal so that queries stay static strings.
macro_rules! task_select {
    () => {
        "SELECT run_public_id, task_key, kind, round, callable_name, tool_name, tool_input, \
    tool_call_id, target_executor_public_id, effect_profile, timeout_ms, status, claimed, claim_token_digest, \
    started_at, deadline_at, result, error_key, settled_at, approval FROM tasks"
    };
}

use std::sync::Arc;

use serde_json::Value;
use sqlx::any::AnyRow;
use sqlx::{AnyConnection, Row};

use nexus_proto::{ExecutionId, RunnerId, TaskKey, TaskStatus};

use super::save_bytes::counted;
use super::{Store, StoreError, StoreResult, TaskRow, json_opt, parse, parse_opt};

impl Store {
    /// Reads one task.
    ///
    /// # Errors
    /// [`StoreError`] on a database failure.
    pub async fn task(&self, run: ExecutionId, task_key: TaskKey) -> StoreResult<Option<TaskRow>> {
        let row = sqlx::query(concat!(task_select!(), " WHERE run_public_id = $1 AND task_key = $2"))
            .bind(run.to_string())
            .bind(task_key.to_string())
            .fetch_optional(self.reader())
            .await?;
        row.as_ref().map(task_of).transpose()
    }

    /// Every task of an execution, by round then key.
    ///
    /// # Errors
    /// [`StoreError`] on a database failure.
    pub async fn tasks_of(&self, run: ExecutionId) -> StoreResult<Vec<TaskRow>> {
        let rows = sqlx::query(concat!(task_select!(), " WHERE run_public_id = $1 ORDER BY round, task_key"))
            .bind(run.to_string())
            .fetch_all(self.reader())
            .await?;
        rows.iter().map(task_of).collect()
    }

    /// Every open (not settled) task addressed to an executor, oldest first: the inbox's offer
    /// order `(started_at, task_key)`.
    ///
    /// Served by the partial index `tasks_open_inbox` (migration 0005) in that order, so the read
    /// costs the executor's open rows, never the settled history, and needs no sort. The status
    /// list must stay verbatim the index's, or neither backend uses it.
    ///
    /// # Errors
    /// [`StoreError`] on a database failure.
    pub async fn open_tasks_for(&self, executor: RunnerId) -> StoreResult<Vec<TaskRow>> {
        let rows = sqlx::query(concat!(
            task_select!(),
            " WHERE target_executor_public_id = $1 AND status IN ('dispatched', 'running') ORDER BY started_at, task_key"
        ))
        .bind(executor.to_string())
        .fetch_all(self.reader())
        .await?;
        rows.iter().map(task_of).collect()
    }

    /// Executors that have open tasks, for recovery at start-up.
    ///
    /// Scans the partial index `tasks_open_inbox` (migration 0005), which holds only open rows;
    /// the status list must stay verbatim the index's.
    ///
    /// # Errors
    /// [`StoreError`] on a database failure.
    pub async fn executors_with_open_tasks(&self) -> StoreResult<Vec<RunnerId>> {
        let rows = sqlx::query(
            "SELECT DISTINCT target_executor_public_id AS id FROM tasks \
             WHERE status IN ('dispatched', 'running') AND target_executor_public_id IS NOT NULL",
        )
        .fetch_all(self.reader())
        .await?;
        rows.iter().map(|r| parse(&r.try_get::<String, _>("id")?)).collect()
    }

    /// Writes a task's mutable columns (claim, deadline, status, result).
    ///
    /// The write is conditional: it applies only while the stored row holds no claim token or the
    /// same one as `task`. A claim sets a fresh token on a row that had none, so of two writers
    /// that both saw an unclaimed task (two nexus nodes on one PostgreSQL database) exactly one
    /// wins; the other, and any write from a stale copy of a claimed task, gets
    /// [`StoreError::Conflict`] and changes nothing. PostgreSQL holds the row lock for the
    /// statement and re-checks the condition after a concurrent writer commits; SQLite takes one
    /// writer at a time. A task that does not exist is left alone, as before.
    ///
    /// # Errors
    /// [`StoreError::Conflict`] when the row holds another claim; [`StoreError`] on a database
    /// failure.
    pub async fn update_task(&self, task: &TaskRow) -> StoreResult<()> {
        // Group-committed: answered once the batch holding this write is durable.
        let task = Arc::new(task.clone());
        self.writer
            .write(move |connection| {
                let task = task.clone();
                Box::pin(async move { update_task_in(connection, &task).await })
            })
            .await
    }

    /// Writes several tasks' mutable columns as [`Store::update_task`] does, in one
    /// group-committed write: a runner's batch of claims and settlements, or a pause moving every
    /// open deadline of an execution at one runner (issue 10, item 1).
    ///
    /// Each row is conditional as in [`Store::update_task`]; answers, per row and in order,
    /// whether it was written (`false`: the row holds another claim and nothing changed). A row
    /// that lost never fails its neighbours.
    ///
    /// # Errors
    /// [`StoreError`] on a database failure; nothing is written then.
    pub async fn update_tasks(&self, tasks: Vec<TaskRow>) -> StoreResult<Vec<bool>> {
        if tasks.is_empty() {
            return Ok(Vec::new());
        }
        let tasks = Arc::new(tasks);
        self.writer
            .write(move |connection| {
                let tasks = tasks.clone();
                Box::pin(async move {
                    let mut written = Vec::with_capacity(tasks.len());
                    for task in tasks.iter() {
                        written.push(match update_task_in(connection, task).await {
                            Ok(()) => true,
                            Err(StoreError::Conflict(_)) => false,
                            Err(other) => return Err(other),
                        });
                    }
                    Ok(written)
                })
            })
            .await
    }

    /// Writes the approval stage's decision on a parked task (`docs/executions.md`, "Approval"): its status,
    /// effect profile, start, deadline, result, error key, settlement and approval fact.
    ///
    /// The write is conditional: it applies only while the stored row is `needs_approval`, so of
    /// two deciders (an approval and an expiry, or two nexus nodes) exactly one wins. Answers
    /// whether this one did.
    ///
    /// # Errors
    /// [`StoreError`] on a database failure.
    pub async fn decide_task(&self, task: &TaskRow) -> StoreResult<bool> {
        self.decide_task_from(task, TaskStatus::NeedsApproval).await
    }

    /// Writes what [`Store::decide_task`] writes on a task held in `held`: `needs_approval` (a
    /// call parked for approval) or `awaiting_input` (a call of `ask` waiting for its answer,
    /// `docs/kernel-tools.md`, "ask"), so that the answer, the hold's expiry, a stop and a pause
    /// each write only a task still held as they saw it. Of two writers exactly one wins; answers
    /// whether this one did.
    ///
    /// # Errors
    /// [`StoreError`] on a database failure.
    pub async fn decide_task_from(&self, task: &TaskRow, held: TaskStatus) -> StoreResult<bool> {
        let task = Arc::new(task.clone());
        self.writer
            .write(move |connection| {
                let task = task.clone();
                Box::pin(async move {
                    let written = sqlx::query(
                        "UPDATE tasks SET status = $1, effect_profile = $2, started_at = $3, deadline_at = $4, \
                         result = $5, error_key = $6, settled_at = $7, approval = $8 \
                         WHERE run_public_id = $9 AND task_key = $10 AND status = $11",
                    )
                    .bind(task.status.as_str())
                    .bind(task.effect_profile.as_ref().map(Value::to_string))
                    .bind(task.started_at)
                    .bind(task.deadline_at)
                    .bind(task.result.as_ref().map(Value::to_string))
                    .bind(&task.error_key)
                    .bind(task.settled_at)
                    .bind(task.approval.as_ref().map(Value::to_string))
                    .bind(task.run_public_id.to_string())
                    .bind(task.task_key.to_string())
                    .bind(held.as_str())
                    .execute(&mut *connection)
                    .await?;
                    Ok(written.rows_affected() == 1)
                })
            })
            .await
    }

    /// Settles a task that runs in-process in its ExecutionActor (an I/O kernel tool,
    /// `docs/kernel-tools.md`): writes its status, result, error key and settlement as `task` holds
    /// them.
    ///
    /// The write is conditional: it applies only while the stored row is `running`, so a stop that
    /// settled the row `canceled` first wins. Answers whether this write did.
    ///
    /// # Errors
    /// [`StoreError`] on a database failure.
    pub async fn settle_running_task(&self, task: &TaskRow) -> StoreResult<bool> {
        let task = Arc::new(task.clone());
        self.writer
            .write(move |connection| {
                let task = task.clone();
                Box::pin(async move {
                    let written = sqlx::query(
                        "UPDATE tasks SET status = $1, result = $2, error_key = $3, settled_at = $4 \
                         WHERE run_public_id = $5 AND task_key = $6 AND status = 'running'",
                    )
                    .bind(task.status.as_str())
                    .bind(task.result.as_ref().map(Value::to_string))
                    .bind(&task.error_key)
                    .bind(task.settled_at)
                    .bind(task.run_public_id.to_string())
                    .bind(task.task_key.to_string())
                    .execute(&mut *connection)
                    .await?;
                    Ok(written.rows_affected() == 1)
                })
            })
            .await
    }

    /// Starts a task that was written `waiting` (a compaction's summary task, `docs/executions.md`,
    /// "Compaction"): writes its kind, names, input, target, effect profile, budget, status, start,
    /// deadline, result, error key, settlement and approval fact as `task` holds them.
    ///
    /// The write is conditional: it applies only while the stored row is `waiting`, so a stop
    /// that canceled the row first wins. Answers whether this write did.
    ///
    /// # Errors
    /// [`StoreError`] on a database failure.
    pub async fn start_waiting_task(&self, task: &TaskRow) -> StoreResult<bool> {
        let task = Arc::new(task.clone());
        self.writer
            .write(move |connection| {
                let task = task.clone();
                Box::pin(async move {
                    let written = sqlx::query(
                        "UPDATE tasks SET kind = $1, callable_name = $2, tool_name = $3, tool_input = $4, \
                         target_executor_public_id = $5, effect_profile = $6, timeout_ms = $7, status = $8, \
                         started_at = $9, deadline_at = $10, result = $11, error_key = $12, settled_at = $13, \
                         approval = $14 WHERE run_public_id = $15 AND task_key = $16 AND status = 'waiting'",
                    )
                    .bind(task.kind.as_str())
                    .bind(&task.callable_name)
                    .bind(&task.tool_name)
                    .bind(task.tool_input.to_string())
                    .bind(task.target_executor_public_id.map(|id| id.to_string()))
                    .bind(task.effect_profile.as_ref().map(Value::to_string))
                    .bind(task.timeout_ms)
                    .bind(task.status.as_str())
                    .bind(task.started_at)
                    .bind(task.deadline_at)
                    .bind(task.result.as_ref().map(Value::to_string))
                    .bind(&task.error_key)
                    .bind(task.settled_at)
                    .bind(task.approval.as_ref().map(Value::to_string))
                    .bind(task.run_public_id.to_string())
                    .bind(task.task_key.to_string())
                    .execute(&mut *connection)
                    .await?;
                    Ok(written.rows_affected() == 1)
                })
            })
            .await
    }
}

/// [`Store::update_task`]'s statements, on the writer's transaction.
async fn update_task_in(connection: &mut AnyConnection, task: &TaskRow) -> StoreResult<()> {
    let written = sqlx::query(
        "UPDATE tasks SET status = $1, claimed = $2, claim_token_digest = $3, deadline_at = $4, result = $5, \
         error_key = $6, settled_at = $7 WHERE run_public_id = $8 AND task_key = $9 \
         AND (claim_token_digest IS NULL OR claim_token_digest = $3)",
    )
    .bind(task.status.as_str())
    .bind(i64::from(task.claimed))
    .bind(&task.claim_token_digest)
    .bind(task.deadline_at)
    .bind(task.result.as_ref().map(Value::to_string))
    .bind(&task.error_key)
    .bind(task.settled_at)
    .bind(task.run_public_id.to_string())
    .bind(task.task_key.to_string())
    .execute(&mut *connection)
    .await?;
    if written.rows_affected() == 0 && task_exists(connection, task.run_public_id, task.task_key).await? {
        return Err(StoreError::Conflict(format!(
            "task {} of run {} holds another claim; this write came from a stale copy",
            task.task_key, task.run_public_id
        )));
    }
    Ok(())
}

async fn task_exists(connection: &mut AnyConnection, run: ExecutionId, task_key: TaskKey) -> StoreResult<bool> {
    let row = sqlx::query("SELECT 1 FROM tasks WHERE run_public_id = $1 AND task_key = $2")
        .bind(run.to_string())
        .bind(task_key.to_string())
        .fetch_optional(&mut *connection)
        .await?;
    Ok(row.is_some())
}

fn task_of(row: &AnyRow) -> StoreResult<TaskRow> {
    Ok(TaskRow {
        run_public_id: parse(&row.try_get::<String, _>("run_public_id")?)?,
        task_key: parse(&row.try_get::<String, _>("task_key")?)?,
        kind: parse(&row.try_get::<String, _>("kind")?)?,
        round: row.try_get("round")?,
        callable_name: row.try_get("callable_name")?,
        tool_name: row.try_get("tool_name")?,
        tool_input: serde_json::from_str(&row.try_get::<String, _>("tool_input")?)?,
        tool_call_id: row.try_get("tool_call_id")?,
        target_executor_public_id: parse_opt(row.try_get("target_executor_public_id")?)?,
        effect_profile: json_opt(row.try_get("effect_profile")?)?,
        timeout_ms: row.try_get("timeout_ms")?,
        status: parse(&row.try_get::<String, _>("status")?)?,
        claimed: row.try_get::<i64, _>("claimed")? != 0,
        claim_token_digest: row.try_get("claim_token_digest")?,
        started_at: row.try_get("started_at")?,
        deadline_at: row.try_get("deadline_at")?,
        result: json_opt(row.try_get("result")?)?,
        error_key: row.try_get("error_key")?,
        settled_at: row.try_get("settled_at")?,
        approval: json_opt(row.try_get("approval")?)?,
    })
}

/// Task rows per INSERT statement (20 parameters each, far below either backend's bound).
const TASKS_PER_STATEMENT: usize = 100;

/// Inserts `tasks`, up to [`TASKS_PER_STATEMENT`] rows per statement; answers the bytes of text
/// bound.
pub(super) async fn insert_tasks(connection: &mut AnyConnection, tasks: &[TaskRow]) -> StoreResult<u64> {
    let mut bytes = 0;
    for chunk in tasks.chunks(TASKS_PER_STATEMENT) {
        let sql = format!(
            "INSERT INTO tasks (run_public_id, task_key, kind, round, callable_name, tool_name, tool_input, \
             tool_call_id, target_executor_public_id, effect_profile, timeout_ms, status, claimed, claim_token_digest, \
             started_at, deadline_at, result, error_key, settled_at, approval) VALUES {}",
            super::values_list(chunk.len(), 20)
        );
        let mut query = sqlx::query(sqlx::AssertSqlSafe(sql));
        for task in chunk {
            query = query
                .bind(counted(&mut bytes, task.run_public_id.to_string()))
                .bind(counted(&mut bytes, task.task_key.to_string()))
                .bind(counted(&mut bytes, task.kind.as_str()))
                .bind(task.round)
                .bind(counted(&mut bytes, &task.callable_name))
                .bind(counted(&mut bytes, &task.tool_name))
                .bind(counted(&mut bytes, task.tool_input.to_string()))
                .bind(counted(&mut bytes, &task.tool_call_id))
                .bind(counted(&mut bytes, task.target_executor_public_id.map(|id| id.to_string())))
                .bind(counted(&mut bytes, task.effect_profile.as_ref().map(Value::to_string)))
                .bind(task.timeout_ms)
                .bind(counted(&mut bytes, task.status.as_str()))
                .bind(i64::from(task.claimed))
                .bind(counted(&mut bytes, &task.claim_token_digest))
                .bind(task.started_at)
                .bind(task.deadline_at)
                .bind(counted(&mut bytes, task.result.as_ref().map(Value::to_string)))
                .bind(counted(&mut bytes, &task.error_key))
                .bind(task.settled_at)
                .bind(counted(&mut bytes, task.approval.as_ref().map(Value::to_string)));
        }
        query.execute(&mut *connection).await?;
    }
    Ok(bytes)
}
