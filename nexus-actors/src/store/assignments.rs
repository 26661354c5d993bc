//! Runner assignments: which Agents a `user_private` ("assigned") runner serves
//! (`docs/protocol.md`, "Assignment"). An `account_wide` runner has no rows here: every Agent may
//! use it.

use std::collections::HashSet;

use sqlx::Row;

use nexus_proto::{AssignmentScope, ExecutionId, MemberId, RunnerId};

use super::members::insert_credential;
use super::{Credential, Store, StoreResult, parse};

/// Who a new runner serves.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RunnerAssignment {
    /// Every Agent of the deployment (`account_wide`).
    AccountWide,
    /// Only these Agents (`user_private`: in nexus, "assigned"). The list may be empty: such a
    /// runner serves no one until `nexus admin runner assign` names an Agent.
    Agents(Vec<MemberId>),
}

impl RunnerAssignment {
    /// The scope word the executor row stores.
    pub fn scope(&self) -> AssignmentScope {
        match self {
            RunnerAssignment::AccountWide => AssignmentScope::AccountWide,
            RunnerAssignment::Agents(_) => AssignmentScope::UserPrivate,
        }
    }
}

impl Store {
    /// Creates a runner executor, its transport credential and its assignments in one
    /// transaction.
    ///
    /// # Errors
    /// [`super::StoreError`] on a database failure.
    pub async fn create_executor_for(
        &self,
        public_id: RunnerId,
        display_name: &str,
        credential: &Credential,
        assignment: &RunnerAssignment,
    ) -> StoreResult<()> {
        let mut tx = self.direct_writer().begin().await?;
        let now = self.clock.now_ms();
        let empty = serde_json::json!({"tools": [], "environment": {}, "documents": []});
        sqlx::query(
            "INSERT INTO executors (public_id, kind, display_name, status, assignment_scope, credential_epoch, announcement, created_at) \
             VALUES ($1, 'runner', $2, 'active', $3, 0, $4, $5)",
        )
        .bind(public_id.to_string())
        .bind(display_name)
        .bind(assignment.scope().as_str())
        .bind(empty.to_string())
        .bind(now)
        .execute(&mut *tx)
        .await?;
        if let RunnerAssignment::Agents(agents) = assignment {
            for agent in agents {
                sqlx::query(
                    "INSERT INTO runner_assignments (runner_public_id, agent_public_id, created_at) VALUES ($1, $2, $3) \
                     ON CONFLICT (runner_public_id, agent_public_id) DO NOTHING",
                )
                .bind(public_id.to_string())
                .bind(agent.to_string())
                .bind(now)
                .execute(&mut *tx)
                .await?;
            }
        }
        insert_credential(&mut tx, credential, 0, now).await?;
        tx.commit().await?;
        Ok(())
    }

    /// Assigns `runner` to `agent`. Answers `false` when it was assigned already (nothing
    /// changes). The caller checks that the runner is `user_private` and the member an Agent.
    ///
    /// # Errors
    /// [`super::StoreError`] on a database failure.
    pub async fn assign_runner(&self, runner: RunnerId, agent: MemberId) -> StoreResult<bool> {
        let done = sqlx::query(
            "INSERT INTO runner_assignments (runner_public_id, agent_public_id, created_at) VALUES ($1, $2, $3) \
             ON CONFLICT (runner_public_id, agent_public_id) DO NOTHING",
        )
        .bind(runner.to_string())
        .bind(agent.to_string())
        .bind(self.clock.now_ms())
        .execute(self.direct_writer())
        .await?;
        Ok(done.rows_affected() > 0)
    }

    /// Removes the assignment of `runner` to `agent`. Answers `false` when there was none.
    ///
    /// # Errors
    /// [`super::StoreError`] on a database failure.
    pub async fn unassign_runner(&self, runner: RunnerId, agent: MemberId) -> StoreResult<bool> {
        let done = sqlx::query("DELETE FROM runner_assignments WHERE runner_public_id = $1 AND agent_public_id = $2")
            .bind(runner.to_string())
            .bind(agent.to_string())
            .execute(self.direct_writer())
            .await?;
        Ok(done.rows_affected() > 0)
    }

    /// The Agents `runner` is assigned to, oldest assignment first.
    ///
    /// # Errors
    /// [`super::StoreError`] on a database failure.
    pub async fn runner_agents(&self, runner: RunnerId) -> StoreResult<Vec<MemberId>> {
        let rows = sqlx::query(
            "SELECT agent_public_id FROM runner_assignments WHERE runner_public_id = $1 ORDER BY created_at, agent_public_id",
        )
        .bind(runner.to_string())
        .fetch_all(self.reader())
        .await?;
        rows.iter().map(|row| parse(&row.try_get::<String, _>("agent_public_id")?)).collect()
    }

    /// The runners assigned to `agent`.
    ///
    /// # Errors
    /// [`super::StoreError`] on a database failure.
    pub async fn runners_assigned_to(&self, agent: MemberId) -> StoreResult<HashSet<RunnerId>> {
        let rows = sqlx::query("SELECT runner_public_id FROM runner_assignments WHERE agent_public_id = $1")
            .bind(agent.to_string())
            .fetch_all(self.reader())
            .await?;
        rows.iter().map(|row| parse(&row.try_get::<String, _>("runner_public_id")?)).collect()
    }

    /// Whether `runner` is assigned to `agent`.
    ///
    /// # Errors
    /// [`super::StoreError`] on a database failure.
    pub async fn runner_assigned(&self, runner: RunnerId, agent: MemberId) -> StoreResult<bool> {
        let row = sqlx::query(
            "SELECT 1 AS assigned FROM runner_assignments WHERE runner_public_id = $1 AND agent_public_id = $2",
        )
        .bind(runner.to_string())
        .bind(agent.to_string())
        .fetch_optional(self.reader())
        .await?;
        Ok(row.is_some())
    }

    /// The executions among `runs` whose answering Agent `runner` is assigned to, in one read:
    /// what an assigned runner's inbox checks at dispatch and claim (`docs/protocol.md`,
    /// "Assignment").
    ///
    /// # Errors
    /// [`super::StoreError`] on a database failure.
    pub async fn runs_served_by(&self, runner: RunnerId, runs: &[ExecutionId]) -> StoreResult<HashSet<ExecutionId>> {
        if runs.is_empty() {
            return Ok(HashSet::new());
        }
        // The runs take $1..$n, the runner the placeholder after them.
        let list: Vec<String> = (1..=runs.len()).map(|n| format!("${n}")).collect();
        let sql = format!(
            "SELECT e.public_id FROM executions e JOIN runner_assignments a \
             ON a.agent_public_id = e.member_public_id AND a.runner_public_id = ${} \
             WHERE e.public_id IN ({})",
            runs.len() + 1,
            list.join(", ")
        );
        // Only placeholders are formatted in; every value is bound.
        let mut query = sqlx::query(sqlx::AssertSqlSafe(sql));
        for run in runs {
            query = query.bind(run.to_string());
        }
        let rows = query.bind(runner.to_string()).fetch_all(self.reader()).await?;
        rows.iter().map(|row| parse(&row.try_get::<String, _>("public_id")?)).collect()
    }
}
