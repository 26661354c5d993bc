//! Memory documents and their revisions (`docs/kernel-tools.md`, "memory"; migration 0014).
//!
//! A write is one job of the group-commit writer ([`super::writer`]): it reads the document,
//! applies the change (a whole content, an exact edit, a delete), checks the bounds and the
//! caller's expectation, then writes the document and one revision, all in the writer's
//! transaction. The writer runs its jobs one after another, so two writes of one document (two
//! executions, a door and a model) serialize and neither is lost: each is a revision. A refusal
//! writes nothing and is an answer, never an error, so it does not spoil the batch.
//!
//! A write by a kernel call records its task (execution + task key, unique): the same call run
//! again (a restart relaunches a call it finds `running`) finds that revision and answers it
//! without writing again (the catalog's `reconciliation: lookup`).

use std::sync::Arc;

use sqlx::{AnyConnection, Row};

use nexus_proto::{ExecutionId, MemberId, TaskKey};

use crate::memory::{DOCUMENT_BYTES, DOCUMENTS_PER_OWNER, DocumentInfo, MemoryRoot};

use super::{Store, StoreResult, parse_opt};

/// Who made a revision.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MemoryAuthor {
    /// A memory tool call: the execution and its task key.
    Task {
        /// The calling execution.
        execution: ExecutionId,
        /// The call's task key.
        task_key: TaskKey,
    },
    /// A person or program through the memory doors.
    Member(MemberId),
}

/// What a write does to a document.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MemoryChange {
    /// Replaces (or creates) the whole content.
    Put(String),
    /// Replaces the one occurrence of `old_text` with `new_text`.
    Edit {
        /// Must occur exactly once.
        old_text: String,
        /// Its replacement.
        new_text: String,
    },
    /// Deletes the document (a delete marker revision).
    Delete,
}

/// The door's condition on a write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Expected {
    /// No condition (the memory tools).
    Any,
    /// The document must not exist (`expected_revision: null`).
    Absent,
    /// The document must be at this revision.
    Revision(i64),
}

/// The answer to a write.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MemoryWritten {
    /// A revision was written (or, `replayed`, the call's own earlier revision was found).
    Written {
        /// The new revision.
        revision: i64,
        /// The content's bytes (0 for a delete).
        bytes: i64,
        /// Whether it is a delete marker.
        deleted: bool,
        /// Whether this is the call's earlier write, answered again.
        replayed: bool,
    },
    /// The document does not exist (edit, delete, or a conditional write of a revision).
    NotFound,
    /// The document is not at the expected revision; `current` is its revision (None: absent).
    Stale {
        /// The current revision, if the document exists.
        current: Option<i64>,
    },
    /// `old_text` does not occur.
    NoMatch,
    /// `old_text` occurs `count` times.
    Ambiguous {
        /// Its occurrences.
        count: usize,
    },
    /// The content would be `bytes` long, over [`DOCUMENT_BYTES`].
    TooLarge {
        /// The content's size.
        bytes: usize,
    },
    /// The root holds [`DOCUMENTS_PER_OWNER`] documents already.
    TooMany,
}

/// A document as stored.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemoryDocument {
    /// The path after the binding.
    pub path: String,
    /// The content.
    pub content: String,
    /// The current revision.
    pub revision: i64,
    /// When it was written, Unix ms.
    pub updated_at: i64,
}

/// One revision of a document's history.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemoryRevision {
    /// Its number, from 1.
    pub revision: i64,
    /// The content it wrote (None: a delete marker).
    pub content: Option<String>,
    /// The content's bytes.
    pub bytes: i64,
    /// The execution whose call wrote it, if a call did.
    pub execution_public_id: Option<ExecutionId>,
    /// That call's task key.
    pub task_key: Option<TaskKey>,
    /// The member who wrote it through a door, if one did.
    pub member_public_id: Option<MemberId>,
    /// When, Unix ms.
    pub created_at: i64,
}

/// The most revisions a history read answers (the newest).
pub const REVISIONS_BOUND: i64 = 200;

fn root_binds(root: &MemoryRoot) -> (String, &'static str, String) {
    (root.agent_public_id.to_string(), root.scope.as_str(), root.owner_public_id.to_string())
}

impl Store {
    /// The live document at `path` of `root`, if any.
    ///
    /// # Errors
    /// [`super::StoreError`] on a database failure.
    pub async fn memory_document(&self, root: &MemoryRoot, path: &str) -> StoreResult<Option<MemoryDocument>> {
        let (agent, scope, owner) = root_binds(root);
        let row = sqlx::query(
            "SELECT content, revision, updated_at FROM memory_documents \
             WHERE agent_public_id = $1 AND scope = $2 AND owner_public_id = $3 AND path = $4 AND content IS NOT NULL",
        )
        .bind(agent)
        .bind(scope)
        .bind(owner)
        .bind(path)
        .fetch_optional(self.reader())
        .await?;
        row.map(|row| {
            Ok(MemoryDocument {
                path: path.to_owned(),
                content: row.try_get("content")?,
                revision: row.try_get("revision")?,
                updated_at: row.try_get("updated_at")?,
            })
        })
        .transpose()
    }

    /// The live documents of `root` whose path starts with `prefix`, by path (at most
    /// [`DOCUMENTS_PER_OWNER`] exist).
    ///
    /// # Errors
    /// [`super::StoreError`] on a database failure.
    pub async fn memory_list(&self, root: &MemoryRoot, prefix: &str) -> StoreResult<Vec<DocumentInfo>> {
        let (agent, scope, owner) = root_binds(root);
        let rows = sqlx::query(
            "SELECT path, bytes, revision, updated_at FROM memory_documents \
             WHERE agent_public_id = $1 AND scope = $2 AND owner_public_id = $3 AND content IS NOT NULL ORDER BY path",
        )
        .bind(agent)
        .bind(scope)
        .bind(owner)
        .fetch_all(self.reader())
        .await?;
        let mut listed = Vec::with_capacity(rows.len());
        for row in rows {
            let path: String = row.try_get("path")?;
            if !path.starts_with(prefix) {
                continue;
            }
            listed.push(DocumentInfo {
                path,
                bytes: row.try_get("bytes")?,
                revision: row.try_get("revision")?,
                updated_at: row.try_get("updated_at")?,
            });
        }
        Ok(listed)
    }

    /// The live documents of `root` with their contents, by path, for a search (at most
    /// [`DOCUMENTS_PER_OWNER`] of at most [`DOCUMENT_BYTES`] each).
    ///
    /// # Errors
    /// [`super::StoreError`] on a database failure.
    pub async fn memory_contents(&self, root: &MemoryRoot) -> StoreResult<Vec<MemoryDocument>> {
        let (agent, scope, owner) = root_binds(root);
        let rows = sqlx::query(
            "SELECT path, content, revision, updated_at FROM memory_documents \
             WHERE agent_public_id = $1 AND scope = $2 AND owner_public_id = $3 AND content IS NOT NULL ORDER BY path",
        )
        .bind(agent)
        .bind(scope)
        .bind(owner)
        .fetch_all(self.reader())
        .await?;
        rows.iter()
            .map(|row| {
                Ok(MemoryDocument {
                    path: row.try_get("path")?,
                    content: row.try_get("content")?,
                    revision: row.try_get("revision")?,
                    updated_at: row.try_get("updated_at")?,
                })
            })
            .collect()
    }

    /// The newest [`REVISIONS_BOUND`] revisions of `path` in `root`, oldest first (deleted
    /// documents keep their history).
    ///
    /// # Errors
    /// [`super::StoreError`] on a database failure.
    pub async fn memory_revisions(&self, root: &MemoryRoot, path: &str) -> StoreResult<Vec<MemoryRevision>> {
        let (agent, scope, owner) = root_binds(root);
        let rows = sqlx::query(
            "SELECT revision, content, bytes, execution_public_id, task_key, member_public_id, created_at \
             FROM memory_revisions WHERE agent_public_id = $1 AND scope = $2 AND owner_public_id = $3 AND path = $4 \
             ORDER BY revision DESC LIMIT $5",
        )
        .bind(agent)
        .bind(scope)
        .bind(owner)
        .bind(path)
        .bind(REVISIONS_BOUND)
        .fetch_all(self.reader())
        .await?;
        let mut revisions = rows
            .iter()
            .map(|row| {
                Ok(MemoryRevision {
                    revision: row.try_get("revision")?,
                    content: row.try_get("content")?,
                    bytes: row.try_get("bytes")?,
                    execution_public_id: parse_opt(row.try_get("execution_public_id")?)?,
                    task_key: parse_opt(row.try_get("task_key")?)?,
                    member_public_id: parse_opt(row.try_get("member_public_id")?)?,
                    created_at: row.try_get("created_at")?,
                })
            })
            .collect::<StoreResult<Vec<_>>>()?;
        revisions.reverse();
        Ok(revisions)
    }

    /// Writes one revision of `path` in `root` (module docs): the change, under `expected`, by
    /// `author`, in one transaction of the writer. A kernel call's second run answers its first
    /// revision (`replayed`). Refusals write nothing.
    ///
    /// # Errors
    /// [`super::StoreError`] on a database failure.
    pub async fn memory_write(
        &self,
        root: MemoryRoot,
        path: &str,
        change: MemoryChange,
        expected: Expected,
        author: MemoryAuthor,
    ) -> StoreResult<MemoryWritten> {
        let path: Arc<str> = Arc::from(path);
        let change = Arc::new(change);
        let now = self.clock.now_ms();
        self.writer
            .write(move |connection| {
                let (path, change) = (path.clone(), change.clone());
                Box::pin(async move { write_job(connection, root, &path, &change, expected, author, now).await })
            })
            .await
    }
}

async fn write_job(
    connection: &mut AnyConnection,
    root: MemoryRoot,
    path: &str,
    change: &MemoryChange,
    expected: Expected,
    author: MemoryAuthor,
    now: i64,
) -> StoreResult<MemoryWritten> {
    if let MemoryAuthor::Task { execution, task_key } = author {
        let earlier = sqlx::query(
            "SELECT revision, content, bytes FROM memory_revisions WHERE execution_public_id = $1 AND task_key = $2",
        )
        .bind(execution.to_string())
        .bind(task_key.to_string())
        .fetch_optional(&mut *connection)
        .await?;
        if let Some(row) = earlier {
            let content: Option<String> = row.try_get("content")?;
            return Ok(MemoryWritten::Written {
                revision: row.try_get("revision")?,
                bytes: row.try_get("bytes")?,
                deleted: content.is_none(),
                replayed: true,
            });
        }
    }
    let (agent, scope, owner) = root_binds(&root);
    let current = sqlx::query(
        "SELECT content, revision FROM memory_documents \
         WHERE agent_public_id = $1 AND scope = $2 AND owner_public_id = $3 AND path = $4",
    )
    .bind(&agent)
    .bind(scope)
    .bind(&owner)
    .bind(path)
    .fetch_optional(&mut *connection)
    .await?;
    let (content, last): (Option<String>, i64) = match current {
        Some(row) => (row.try_get("content")?, row.try_get("revision")?),
        None => (None, 0),
    };
    let live = content.as_ref().map(|_| last);
    match expected {
        Expected::Any => {}
        Expected::Absent if live.is_some() => return Ok(MemoryWritten::Stale { current: live }),
        Expected::Absent => {}
        Expected::Revision(_) if live.is_none() => return Ok(MemoryWritten::NotFound),
        Expected::Revision(revision) if live != Some(revision) => return Ok(MemoryWritten::Stale { current: live }),
        Expected::Revision(_) => {}
    }
    let next: Option<String> = match change {
        MemoryChange::Put(text) => Some(text.clone()),
        MemoryChange::Delete => match &content {
            None => return Ok(MemoryWritten::NotFound),
            Some(_) => None,
        },
        MemoryChange::Edit { old_text, new_text } => {
            let Some(text) = &content else { return Ok(MemoryWritten::NotFound) };
            let count = if old_text.is_empty() { 0 } else { text.matches(old_text.as_str()).count() };
            match count {
                0 => return Ok(MemoryWritten::NoMatch),
                1 => Some(text.replacen(old_text.as_str(), new_text, 1)),
                count => return Ok(MemoryWritten::Ambiguous { count }),
            }
        }
    };
    if let Some(text) = &next {
        if text.len() > DOCUMENT_BYTES {
            return Ok(MemoryWritten::TooLarge { bytes: text.len() });
        }
        if content.is_none() {
            let row = sqlx::query(
                "SELECT COUNT(*) AS live FROM memory_documents \
                 WHERE agent_public_id = $1 AND scope = $2 AND owner_public_id = $3 AND content IS NOT NULL",
            )
            .bind(&agent)
            .bind(scope)
            .bind(&owner)
            .fetch_one(&mut *connection)
            .await?;
            let live: i64 = row.try_get("live")?;
            if usize::try_from(live).unwrap_or(usize::MAX) >= DOCUMENTS_PER_OWNER {
                return Ok(MemoryWritten::TooMany);
            }
        }
    }
    let revision = last + 1;
    let bytes = i64::try_from(next.as_ref().map_or(0, String::len)).unwrap_or(i64::MAX);
    sqlx::query(
        "INSERT INTO memory_documents (agent_public_id, scope, owner_public_id, path, content, bytes, revision, \
         created_at, updated_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $8) \
         ON CONFLICT (agent_public_id, scope, owner_public_id, path) DO UPDATE SET content = excluded.content, \
         bytes = excluded.bytes, revision = excluded.revision, updated_at = excluded.updated_at",
    )
    .bind(&agent)
    .bind(scope)
    .bind(&owner)
    .bind(path)
    .bind(next.clone())
    .bind(bytes)
    .bind(revision)
    .bind(now)
    .execute(&mut *connection)
    .await?;
    let (execution, task_key, member) = match author {
        MemoryAuthor::Task { execution, task_key } => (Some(execution.to_string()), Some(task_key.to_string()), None),
        MemoryAuthor::Member(member) => (None, None, Some(member.to_string())),
    };
    sqlx::query(
        "INSERT INTO memory_revisions (agent_public_id, scope, owner_public_id, path, revision, content, bytes, \
         execution_public_id, task_key, member_public_id, created_at) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)",
    )
    .bind(&agent)
    .bind(scope)
    .bind(&owner)
    .bind(path)
    .bind(revision)
    .bind(next.clone())
    .bind(bytes)
    .bind(execution)
    .bind(task_key)
    .bind(member)
    .bind(now)
    .execute(&mut *connection)
    .await?;
    Ok(MemoryWritten::Written { revision, bytes, deleted: next.is_none(), replayed: false })
}
