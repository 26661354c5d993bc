//! Agent profiles, their prompt documents and named definitions.

use serde_json::Value;
use sqlx::Row;

use nexus_proto::MemberId;

use crate::declaration::PromptSlot;

use super::{NamedDefinitionRow, ProfileRow, Store, StoreError, StoreResult, json_opt};

impl Store {
    /// Reads an Agent's profile; `None` for a member without one (a Human).
    ///
    /// # Errors
    /// [`StoreError`] on a database failure.
    pub async fn profile(&self, member: MemberId) -> StoreResult<Option<ProfileRow>> {
        let row = sqlx::query(
            "SELECT configuration, system_prompt, system_prompt_version, summarizer, summarizer_version, declared_at \
             FROM profiles WHERE member_public_id = $1",
        )
        .bind(member.to_string())
        .fetch_optional(self.reader())
        .await?;
        row.map(|row| {
            Ok(ProfileRow {
                configuration: json_opt(row.try_get("configuration")?)?,
                system_prompt: json_opt(row.try_get("system_prompt")?)?,
                system_prompt_version: row.try_get("system_prompt_version")?,
                summarizer: json_opt(row.try_get("summarizer")?)?,
                summarizer_version: row.try_get("summarizer_version")?,
                declared_at: row.try_get("declared_at")?,
            })
        })
        .transpose()
    }

    /// Replaces the whole declaration and both prompt documents in one statement; both document
    /// versions advance.
    ///
    /// # Errors
    /// [`StoreError`] on a database failure.
    pub async fn declare_profile(
        &self,
        member: MemberId,
        configuration: &Value,
        system_prompt: Option<&Value>,
        summarizer: Option<&Value>,
    ) -> StoreResult<ProfileRow> {
        let declared_at = self.clock.now_ms();
        // The new versions come back from the write itself: no read-back of the (up to 1 MiB)
        // configuration that was just written.
        let versions = sqlx::query(
            "UPDATE profiles SET configuration = $1, system_prompt = $2, summarizer = $3, \
             system_prompt_version = system_prompt_version + 1, summarizer_version = summarizer_version + 1, \
             declared_at = $4 WHERE member_public_id = $5 RETURNING system_prompt_version, summarizer_version",
        )
        .bind(serde_json::to_string(configuration)?)
        .bind(system_prompt.map(Value::to_string))
        .bind(summarizer.map(Value::to_string))
        .bind(declared_at)
        .bind(member.to_string())
        .fetch_optional(self.reader())
        .await?
        .ok_or_else(|| StoreError::Conflict("profile vanished".into()))?;
        Ok(ProfileRow {
            configuration: Some(configuration.clone()),
            system_prompt: system_prompt.cloned(),
            system_prompt_version: versions.try_get("system_prompt_version")?,
            summarizer: summarizer.cloned(),
            summarizer_version: versions.try_get("summarizer_version")?,
            declared_at: Some(declared_at),
        })
    }

    /// Rewrites one prompt-document slot (`system_prompt` or `summarizer`) and advances its
    /// version, even for identical content.
    ///
    /// # Errors
    /// [`StoreError`] on a database failure.
    pub async fn set_prompt_document(
        &self,
        member: MemberId,
        slot: PromptSlot,
        document: Option<&Value>,
    ) -> StoreResult<ProfileRow> {
        let sql = match slot {
            PromptSlot::SystemPrompt => {
                "UPDATE profiles SET system_prompt = $1, system_prompt_version = system_prompt_version + 1 WHERE member_public_id = $2"
            }
            PromptSlot::Summarizer => {
                "UPDATE profiles SET summarizer = $1, summarizer_version = summarizer_version + 1 WHERE member_public_id = $2"
            }
        };
        sqlx::query(sql)
            .bind(document.map(Value::to_string))
            .bind(member.to_string())
            .execute(self.direct_writer())
            .await?;
        self.profile(member).await?.ok_or_else(|| StoreError::Conflict("profile vanished".into()))
    }

    // ---- named definitions -----------------------------------------------------------------------

    /// The live (not deleted) named definitions of an Agent, by name.
    ///
    /// # Errors
    /// [`StoreError`] on a database failure.
    pub async fn named_definitions(&self, member: MemberId) -> StoreResult<Vec<NamedDefinitionRow>> {
        let rows = sqlx::query(
            "SELECT name, identifier, scope, description, configuration, display_name, system_prompt, created_at, updated_at \
             FROM named_definitions WHERE member_public_id = $1 AND deleted_at IS NULL ORDER BY name",
        )
        .bind(member.to_string())
        .fetch_all(self.reader())
        .await?;
        rows.iter()
            .map(|row| {
                Ok(NamedDefinitionRow {
                    name: row.try_get("name")?,
                    identifier: row.try_get("identifier")?,
                    scope: row.try_get("scope")?,
                    description: row.try_get("description")?,
                    configuration: serde_json::from_str(&row.try_get::<String, _>("configuration")?)?,
                    display_name: row.try_get("display_name")?,
                    system_prompt: json_opt(row.try_get("system_prompt")?)?,
                    created_at: row.try_get("created_at")?,
                    updated_at: row.try_get("updated_at")?,
                })
            })
            .collect()
    }

    /// Creates, replaces or restores a named definition. Returns `true` when it was minted (no row
    /// existed), `false` when an existing or deleted row was replaced.
    ///
    /// # Errors
    /// [`StoreError`] on a database failure.
    pub async fn put_named_definition(&self, member: MemberId, definition: &NamedDefinitionRow) -> StoreResult<bool> {
        let now = self.clock.now_ms();
        // Write first (replace, else insert): a read-then-write transaction cannot upgrade its
        // SQLite lock while another writer commits.
        let mut tx = self.direct_writer().begin().await?;
        let replaced = sqlx::query(
            "UPDATE named_definitions SET identifier = $1, scope = $2, description = $3, configuration = $4, display_name = $5, \
             system_prompt = $6, updated_at = $7, deleted_at = NULL WHERE member_public_id = $8 AND name = $9",
        )
        .bind(&definition.identifier)
        .bind(&definition.scope)
        .bind(&definition.description)
        .bind(definition.configuration.to_string())
        .bind(&definition.display_name)
        .bind(definition.system_prompt.as_ref().map(Value::to_string))
        .bind(now)
        .bind(member.to_string())
        .bind(&definition.name)
        .execute(&mut *tx)
        .await?
        .rows_affected()
            > 0;
        if !replaced {
            sqlx::query(
                "INSERT INTO named_definitions (member_public_id, name, identifier, scope, description, configuration, \
                 display_name, system_prompt, created_at, updated_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)",
            )
            .bind(member.to_string())
            .bind(&definition.name)
            .bind(&definition.identifier)
            .bind(&definition.scope)
            .bind(&definition.description)
            .bind(definition.configuration.to_string())
            .bind(&definition.display_name)
            .bind(definition.system_prompt.as_ref().map(Value::to_string))
            .bind(now)
            .bind(now)
            .execute(&mut *tx)
            .await?;
        }
        tx.commit().await?;
        Ok(!replaced)
    }

    /// Deletes a named definition. Returns `false` when there was no live one.
    ///
    /// # Errors
    /// [`StoreError`] on a database failure.
    pub async fn delete_named_definition(&self, member: MemberId, name: &str) -> StoreResult<bool> {
        let done = sqlx::query(
            "UPDATE named_definitions SET deleted_at = $1 WHERE member_public_id = $2 AND name = $3 AND deleted_at IS NULL",
        )
        .bind(self.clock.now_ms())
        .bind(member.to_string())
        .bind(name)
        .execute(self.direct_writer())
        .await?;
        Ok(done.rows_affected() > 0)
    }
}
