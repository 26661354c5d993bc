//! Members and their credentials.

use sqlx::{Any, Row};
use uuid::Uuid;

use nexus_proto::{ErrorCode, MemberId, MemberKind, MemberStatus, Refusal};

use super::{Credential, MemberRow, Plane, Store, StoreError, StoreResult, parse};
use crate::auth::digest;
use crate::auth::throttle::{CredentialThrottle, Gate, Source};

impl Store {
    /// Creates a member and its first member-plane credential (stored as a digest).
    ///
    /// # Errors
    /// [`StoreError::Conflict`] when the handle is taken.
    pub async fn create_member(&self, member: &MemberRow, credential: &Credential) -> StoreResult<()> {
        // Write first: a transaction that reads and then writes cannot upgrade its SQLite lock
        // while another writer commits ("database is locked"), so the UNIQUE index decides.
        let mut tx = self.direct_writer().begin().await?;
        let now = self.clock.now_ms();
        sqlx::query(
            "INSERT INTO members (public_id, kind, handle, display_name, created_at) VALUES ($1, $2, $3, $4, $5)",
        )
        .bind(member.public_id.to_string())
        .bind(member.kind.as_str())
        .bind(&member.handle)
        .bind(&member.display_name)
        .bind(now)
        .execute(&mut *tx)
        .await
        .map_err(|e| match e {
            sqlx::Error::Database(db) if db.is_unique_violation() => {
                StoreError::Conflict(format!("the handle {} is taken", member.handle))
            }
            other => StoreError::Database(other),
        })?;
        insert_credential(&mut tx, credential, 0, now).await?;
        if member.kind == MemberKind::Agent {
            sqlx::query(
                "INSERT INTO profiles (member_public_id, system_prompt_version, summarizer_version) VALUES ($1, 0, 0)",
            )
            .bind(member.public_id.to_string())
            .execute(&mut *tx)
            .await?;
        }
        tx.commit().await?;
        Ok(())
    }

    /// Finds the subject of a credential digest on a plane, with the credential's epoch.
    ///
    /// # Errors
    /// [`StoreError`] on a database failure; an unknown digest is `Ok(None)`.
    pub async fn credential(&self, digest: &str) -> StoreResult<Option<(Plane, Uuid, i64)>> {
        let row = sqlx::query(
            "SELECT plane, subject_public_id, credential_epoch FROM credentials WHERE digest = $1 \
             AND (expires_at IS NULL OR expires_at > $2)",
        )
        .bind(digest)
        .bind(self.clock.now_ms())
        .fetch_optional(self.reader())
        .await?;
        let Some(row) = row else { return Ok(None) };
        let plane: String = row.try_get("plane")?;
        let Some(plane) = Plane::from_word(&plane) else { return Ok(None) };
        Ok(Some((plane, parse(&row.try_get::<String, _>("subject_public_id")?)?, row.try_get("credential_epoch")?)))
    }

    /// Authenticates a bearer token on `plane` (`docs/architecture.md`, "Credentials"): returns
    /// the subject and the credential's epoch.
    ///
    /// # Errors
    /// `unauthorized` when the token is unknown, expired, or belongs to the other plane;
    /// `internal` when the store fails.
    pub async fn authenticate(&self, token: &str, plane: Plane) -> Result<(Uuid, i64), Refusal> {
        let found = self
            .credential(&digest(token.trim()))
            .await
            .map_err(|e| Refusal::new(ErrorCode::Internal, format!("credential lookup failed: {e}")))?;
        match found {
            Some((found_plane, subject, epoch)) if found_plane == plane => Ok((subject, epoch)),
            // A token of the other plane is answered as an unknown one: the answer never confirms
            // that a token opens some other door.
            _ => Err(crate::auth::not_accepted(plane)),
        }
    }

    /// [`Store::authenticate`] for a credential presented from `source` (none for an in-process
    /// caller), through `throttle`'s failure budget ([`crate::auth::throttle`]): a spent budget
    /// refuses it unread; a refused credential spends one failure; a good one is remembered for
    /// its source.
    ///
    /// # Errors
    /// As [`Store::authenticate`], and 429 `rate_limited` with `retry_after` while the source's
    /// budget is spent.
    pub async fn authenticate_from(
        &self,
        token: &str,
        plane: Plane,
        throttle: &CredentialThrottle,
        source: Option<Source>,
    ) -> Result<(Uuid, i64), Refusal> {
        let Some(source) = source else { return self.authenticate(token, plane).await };
        let digest = digest(token.trim());
        if let Gate::Refuse(refusal) = throttle.gate(source, &digest, self.clock().now_ms()) {
            return Err(refusal);
        }
        let found = self.authenticate(token, plane).await;
        match &found {
            Ok(_) => throttle.succeeded(source, &digest, self.clock().now_ms()),
            Err(refusal) if refusal.code == ErrorCode::Unauthorized => throttle.failed(source, self.clock().now_ms()),
            Err(_) => {}
        }
        found
    }

    /// Reads a member.
    ///
    /// # Errors
    /// [`StoreError`] on a database failure.
    pub async fn member(&self, public_id: MemberId) -> StoreResult<Option<MemberRow>> {
        let row = sqlx::query("SELECT public_id, kind, handle, display_name, status FROM members WHERE public_id = $1")
            .bind(public_id.to_string())
            .fetch_optional(self.reader())
            .await?;
        row.map(|row| {
            Ok(MemberRow {
                public_id,
                kind: parse(&row.try_get::<String, _>("kind")?)?,
                handle: row.try_get("handle")?,
                display_name: row.try_get("display_name")?,
                status: parse(&row.try_get::<String, _>("status")?)?,
            })
        })
        .transpose()
    }

    /// Sets a member's standing (`active` or `suspended`). Returns `false` for an unknown member.
    ///
    /// # Errors
    /// [`StoreError`] on a database failure.
    pub async fn set_member_status(&self, public_id: MemberId, status: MemberStatus) -> StoreResult<bool> {
        let done = sqlx::query("UPDATE members SET status = $1 WHERE public_id = $2")
            .bind(status.as_str())
            .bind(public_id.to_string())
            .execute(self.direct_writer())
            .await?;
        Ok(done.rows_affected() > 0)
    }
}

pub(super) async fn insert_credential(
    tx: &mut sqlx::Transaction<'_, Any>,
    credential: &Credential,
    epoch: i64,
    now: i64,
) -> StoreResult<()> {
    sqlx::query(
        "INSERT INTO credentials (digest, plane, subject_public_id, credential_epoch, created_at) VALUES ($1, $2, $3, $4, $5)",
    )
    .bind(&credential.digest)
    .bind(credential.plane.as_str())
    .bind(credential.subject.to_string())
    .bind(epoch)
    .bind(now)
    .execute(&mut **tx)
    .await?;
    Ok(())
}
