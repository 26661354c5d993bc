//! Executors (runners): their rows, announcements, presence, pairing and revocation.

use serde_json::Value;
use sqlx::Row;

use nexus_proto::RunnerId;

use super::members::insert_credential;
use super::{Credential, ExecutorRow, PresenceEvent, RunnerAssignment, Store, StoreResult, parse};

impl Store {
    /// Creates an `account_wide` runner executor and its transport credential (what every runner
    /// was before assignments; [`Store::create_executor_for`] chooses).
    ///
    /// # Errors
    /// [`StoreError`] on a database failure.
    pub async fn create_executor(
        &self,
        public_id: RunnerId,
        display_name: &str,
        credential: &Credential,
    ) -> StoreResult<()> {
        self.create_executor_for(public_id, display_name, credential, &RunnerAssignment::AccountWide).await
    }

    /// Reads an executor.
    ///
    /// # Errors
    /// [`StoreError`] on a database failure.
    pub async fn executor(&self, public_id: RunnerId) -> StoreResult<Option<ExecutorRow>> {
        let row = sqlx::query(
            "SELECT kind, display_name, status, assignment_scope, credential_epoch, announcement, announced_at, \
             connected_at, last_seen_at FROM executors WHERE public_id = $1",
        )
        .bind(public_id.to_string())
        .fetch_optional(self.reader())
        .await?;
        row.map(|row| {
            Ok(ExecutorRow {
                public_id,
                kind: parse(&row.try_get::<String, _>("kind")?)?,
                display_name: row.try_get("display_name")?,
                status: parse(&row.try_get::<String, _>("status")?)?,
                assignment_scope: parse(&row.try_get::<String, _>("assignment_scope")?)?,
                credential_epoch: row.try_get("credential_epoch")?,
                announcement: serde_json::from_str(&row.try_get::<String, _>("announcement")?)?,
                announced_at: row.try_get("announced_at")?,
                connected_at: row.try_get("connected_at")?,
                last_seen_at: row.try_get("last_seen_at")?,
            })
        })
        .transpose()
    }

    /// Stores a whole-replacement announcement.
    ///
    /// # Errors
    /// [`StoreError`] on a database failure.
    pub async fn set_announcement(&self, public_id: RunnerId, announcement: &Value) -> StoreResult<()> {
        sqlx::query("UPDATE executors SET announcement = $1, announced_at = $2 WHERE public_id = $3")
            .bind(announcement.to_string())
            .bind(self.clock.now_ms())
            .bind(public_id.to_string())
            .execute(self.direct_writer())
            .await?;
        Ok(())
    }

    /// Records a stream's Hello (`connected_at`) and presence (`last_seen_at`).
    ///
    /// # Errors
    /// [`StoreError`] on a database failure.
    pub async fn touch_executor(&self, public_id: RunnerId, presence: PresenceEvent) -> StoreResult<()> {
        let sql = match presence {
            PresenceEvent::Attached => "UPDATE executors SET connected_at = $1, last_seen_at = $1 WHERE public_id = $2",
            PresenceEvent::Seen => "UPDATE executors SET last_seen_at = $1 WHERE public_id = $2",
            PresenceEvent::Detached => {
                "UPDATE executors SET connected_at = NULL, last_seen_at = $1 WHERE public_id = $2"
            }
        };
        let at = self.clock.now_ms();
        // Group-committed: presence is touched on every ping of every stream.
        self.writer
            .write(move |connection| {
                Box::pin(async move {
                    sqlx::query(sql).bind(at).bind(public_id.to_string()).execute(&mut *connection).await?;
                    Ok(())
                })
            })
            .await
    }

    /// Every executor, oldest first.
    ///
    /// # Errors
    /// [`StoreError`] on a database failure.
    pub async fn executors(&self) -> StoreResult<Vec<ExecutorRow>> {
        let rows = sqlx::query("SELECT public_id FROM executors ORDER BY created_at, public_id")
            .fetch_all(self.reader())
            .await?;
        let mut executors = Vec::with_capacity(rows.len());
        for row in rows {
            if let Some(executor) = self.executor(parse(&row.try_get::<String, _>("public_id")?)?).await? {
                executors.push(executor);
            }
        }
        Ok(executors)
    }

    /// Re-pairs a runner: bumps its `credential_epoch`, which fences every older credential and
    /// claim, and stores the new credential under the new epoch. Returns the new epoch, or `None`
    /// for an unknown runner or a revoked one (revocation is final, so its row is left as is).
    ///
    /// # Errors
    /// [`StoreError`] on a database failure.
    pub async fn repair_executor(&self, public_id: RunnerId, credential: &Credential) -> StoreResult<Option<i64>> {
        let mut tx = self.direct_writer().begin().await?;
        let bumped = sqlx::query(
            "UPDATE executors SET credential_epoch = credential_epoch + 1 WHERE public_id = $1 AND status = 'active'",
        )
        .bind(public_id.to_string())
        .execute(&mut *tx)
        .await?;
        if bumped.rows_affected() == 0 {
            return Ok(None);
        }
        let row = sqlx::query("SELECT credential_epoch FROM executors WHERE public_id = $1")
            .bind(public_id.to_string())
            .fetch_one(&mut *tx)
            .await?;
        let epoch: i64 = row.try_get("credential_epoch")?;
        insert_credential(&mut tx, credential, epoch, self.clock.now_ms()).await?;
        tx.commit().await?;
        Ok(Some(epoch))
    }

    /// Revokes a runner for good: it is no longer eligible for claims or dispatch. Returns `false`
    /// for an unknown runner.
    ///
    /// # Errors
    /// [`StoreError`] on a database failure.
    pub async fn revoke_executor(&self, public_id: RunnerId) -> StoreResult<bool> {
        let done = sqlx::query("UPDATE executors SET status = 'revoked' WHERE public_id = $1")
            .bind(public_id.to_string())
            .execute(self.direct_writer())
            .await?;
        Ok(done.rows_affected() > 0)
    }
}
