//! Grants: the Humans who steward or view an Agent (`docs/executions.md`, "People in the loop"),
//! and the conversation facts the standing rule reads.
//!
//! A grant is one row per (Agent, Human) with its [`GrantRole`]; a repeat grant replaces the role
//! and a revoke deletes the row. Nothing caches a grant: every request reads it afresh, so a
//! revoke takes effect on the next request.

use sqlx::Row;

use nexus_proto::{ConversationId, GrantRole, MemberId};

use super::{Store, StoreResult, parse};

/// One grant as stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GrantRow {
    /// The Agent the grant is on.
    pub agent_public_id: MemberId,
    /// The Human who holds it.
    pub human_public_id: MemberId,
    /// What the Human may do.
    pub role: GrantRole,
}

impl Store {
    /// Grants `human` the `role` on `agent`, replacing any role it held. The caller has checked
    /// that both members exist and are of the right kinds.
    ///
    /// # Errors
    /// [`super::StoreError`] on a database failure.
    pub async fn put_grant(&self, agent: MemberId, human: MemberId, role: GrantRole) -> StoreResult<()> {
        let now = self.clock.now_ms();
        // One statement, so two grants racing for the same pair leave one row, the later role.
        sqlx::query(
            "INSERT INTO member_grants (agent_public_id, human_public_id, role, created_at, updated_at) \
             VALUES ($1, $2, $3, $4, $4) \
             ON CONFLICT (agent_public_id, human_public_id) DO UPDATE SET role = excluded.role, \
             updated_at = excluded.updated_at",
        )
        .bind(agent.to_string())
        .bind(human.to_string())
        .bind(role.as_str())
        .bind(now)
        .execute(self.direct_writer())
        .await?;
        Ok(())
    }

    /// Deletes the grant of `human` on `agent`; answers the role it held, or `None` when it held
    /// none.
    ///
    /// # Errors
    /// [`super::StoreError`] on a database failure.
    pub async fn delete_grant(&self, agent: MemberId, human: MemberId) -> StoreResult<Option<GrantRole>> {
        let row =
            sqlx::query("DELETE FROM member_grants WHERE agent_public_id = $1 AND human_public_id = $2 RETURNING role")
                .bind(agent.to_string())
                .bind(human.to_string())
                .fetch_optional(self.direct_writer())
                .await?;
        row.map(|row| parse(&row.try_get::<String, _>("role")?)).transpose()
    }

    /// The role `human` holds on `agent`, if any.
    ///
    /// # Errors
    /// [`super::StoreError`] on a database failure.
    pub async fn grant_role(&self, agent: MemberId, human: MemberId) -> StoreResult<Option<GrantRole>> {
        let row = sqlx::query("SELECT role FROM member_grants WHERE agent_public_id = $1 AND human_public_id = $2")
            .bind(agent.to_string())
            .bind(human.to_string())
            .fetch_optional(self.reader())
            .await?;
        row.map(|row| parse(&row.try_get::<String, _>("role")?)).transpose()
    }

    /// Every grant `human` holds, ordered by Agent id.
    ///
    /// # Errors
    /// [`super::StoreError`] on a database failure.
    pub async fn grants_of(&self, human: MemberId) -> StoreResult<Vec<GrantRow>> {
        let rows = sqlx::query(
            "SELECT agent_public_id, role FROM member_grants WHERE human_public_id = $1 ORDER BY agent_public_id",
        )
        .bind(human.to_string())
        .fetch_all(self.reader())
        .await?;
        rows.iter()
            .map(|row| {
                Ok(GrantRow {
                    agent_public_id: parse(&row.try_get::<String, _>("agent_public_id")?)?,
                    human_public_id: human,
                    role: parse(&row.try_get::<String, _>("role")?)?,
                })
            })
            .collect()
    }

    /// The Agent that answers a conversation (its owner), or `None` for an unknown conversation.
    ///
    /// # Errors
    /// [`super::StoreError`] on a database failure.
    pub async fn conversation_agent(&self, conversation: ConversationId) -> StoreResult<Option<MemberId>> {
        let row = sqlx::query("SELECT member_public_id FROM conversations WHERE public_id = $1")
            .bind(conversation.to_string())
            .fetch_optional(self.reader())
            .await?;
        row.map(|row| parse(&row.try_get::<String, _>("member_public_id")?)).transpose()
    }
}
