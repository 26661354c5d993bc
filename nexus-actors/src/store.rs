//! The durable store: one [`Store`] interface over two backends, the embedded SQLite file in the
//! data dir (the default) and PostgreSQL (several nexus nodes sharing one deployment).
//!
//! Everything that must survive a restart is written here before it is acknowledged (DESIGN.md,
//! "Durability"). Both backends run the same migrations from `migrations/`, which are portable
//! SQL (TEXT and BIGINT only), and the same statement texts through sqlx's `Any` driver; only the
//! opening and the catalog queries differ (the `backend` submodule). Times are Unix milliseconds;
//! booleans are 0/1.

mod backend;
mod writer;

use std::path::Path;
use std::sync::Arc;

use serde_json::Value;
use sqlx::any::AnyRow;
use sqlx::{Any, AnyConnection, AnyPool, Row};
use uuid::Uuid;

use crate::auth::{Credential, Plane};
use crate::config::StoreConfig;

pub use backend::{StoreBackend, is_postgres_url, redact as redact_url};
pub use writer::{GroupCommitStats, MAX_BATCH as GROUP_COMMIT_MAX_BATCH};

use writer::Writer;

/// The task columns, as a literal so that queries stay static strings.
macro_rules! task_select {
    () => {
        "SELECT run_public_id, task_key, kind, round, callable_name, tool_name, tool_input, \
    tool_call_id, target_executor_public_id, effect_profile, timeout_ms, status, claimed, claim_token_digest, \
    started_at, deadline_at, result, error_key, settled_at, approval FROM tasks"
    };
}

/// A store failure. Every variant is an internal error to callers: bad input is refused before
/// it reaches the store.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The database refused or failed a statement.
    #[error("store: {0}")]
    Database(#[from] sqlx::Error),
    /// A migration failed at start-up.
    #[error("store migration: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    /// A stored JSON column did not parse.
    #[error("store: corrupt json: {0}")]
    Json(#[from] serde_json::Error),
    /// The store could not be opened at the data dir.
    #[error("cannot open the store in {path}: {reason}")]
    Open {
        /// The data dir.
        path: std::path::PathBuf,
        /// What failed.
        reason: String,
    },
    /// The PostgreSQL store could not be opened.
    #[error("cannot open the store at {url}: {reason}")]
    OpenDatabase {
        /// The database URL, its password redacted.
        url: String,
        /// What failed.
        reason: String,
    },
    /// A uniqueness rule was broken (e.g. a handle already taken).
    #[error("{0}")]
    Conflict(String),
}

/// Result alias for store calls.
pub type StoreResult<T> = Result<T, StoreError>;

/// The current time in Unix milliseconds.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// A member row.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemberRow {
    /// The member's UUID.
    pub public_id: Uuid,
    /// `agent` or `human`.
    pub kind: String,
    /// Unique handle.
    pub handle: String,
    /// Display name.
    pub display_name: String,
    /// `active`, or `suspended`: a suspended Agent keeps its credentials but is not eligible to
    /// declare (403 `not_authorized`).
    pub status: String,
}

/// A presence change of a runner stream (display only, never a gate).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PresenceEvent {
    /// A stream said Hello: `connected_at` and `last_seen_at` become now.
    Attached,
    /// The stream is alive: `last_seen_at` becomes now.
    Seen,
    /// The stream ended: `connected_at` clears, `last_seen_at` becomes now.
    Detached,
}

/// An executor (runner) row.
#[derive(Clone, Debug, PartialEq)]
pub struct ExecutorRow {
    /// The executor's UUID (`runner_executor_public_id`).
    pub public_id: Uuid,
    /// `runner`.
    pub kind: String,
    /// Display name.
    pub display_name: String,
    /// `active | revoked`.
    pub status: String,
    /// `account_wide | user_private`.
    pub assignment_scope: String,
    /// Bumped on re-pairing; fences old streams and tokens.
    pub credential_epoch: i64,
    /// The canonical announcement `{tools, environment, documents}`.
    pub announcement: Value,
    /// When the last announcement was stored, if ever.
    pub announced_at: Option<i64>,
    /// When the current stream said Hello; `None` while no stream is attached.
    pub connected_at: Option<i64>,
    /// When a frame last arrived.
    pub last_seen_at: Option<i64>,
}

/// The stored profile of an Agent member.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct ProfileRow {
    /// The canonical configuration, `None` until declared.
    pub configuration: Option<Value>,
    /// `{content, role}` or `None`.
    pub system_prompt: Option<Value>,
    /// Advances on every successful rewrite of the slot.
    pub system_prompt_version: i64,
    /// `{content, role}` or `None`.
    pub summarizer: Option<Value>,
    /// Advances on every successful rewrite of the slot.
    pub summarizer_version: i64,
    /// When the profile was last declared.
    pub declared_at: Option<i64>,
}

/// A named definition (REFERENCE.md 3, "Named definitions").
#[derive(Clone, Debug, PartialEq)]
pub struct NamedDefinitionRow {
    /// `[a-z0-9][a-z0-9_-]{1,31}`.
    pub name: String,
    /// `<caller agent_identifier>/<name>`, at most 128 characters.
    pub identifier: String,
    /// `instance | steward`.
    pub scope: String,
    /// One printable line of at most 1024 characters.
    pub description: String,
    /// The canonical configuration.
    pub configuration: Value,
    /// Optional display name.
    pub display_name: Option<String>,
    /// `{content, role}` or `None`.
    pub system_prompt: Option<Value>,
    /// Creation time.
    pub created_at: i64,
    /// Last replacement.
    pub updated_at: i64,
}

/// An input row (admitted intent).
#[derive(Clone, Debug, PartialEq)]
pub struct InputRow {
    /// The input's UUID.
    pub public_id: Uuid,
    /// Its conversation.
    pub conversation_public_id: Uuid,
    /// The member whose profile answers.
    pub member_public_id: Uuid,
    /// The user's text.
    pub text: String,
    /// The authored inline `execution_declaration`, if any.
    pub execution_declaration: Option<Value>,
    /// The selected Runner, if named.
    pub runner_executor_public_id: Option<Uuid>,
    /// The `tool_names` subset, if given.
    pub tool_names: Option<Value>,
}

/// An execution row.
#[derive(Clone, Debug, PartialEq)]
pub struct ExecutionRow {
    /// The execution's UUID (`run_public_id`).
    pub public_id: Uuid,
    /// Its conversation.
    pub conversation_public_id: Uuid,
    /// The input it materializes.
    pub input_public_id: Uuid,
    /// The answering member.
    pub member_public_id: Uuid,
    /// Run status (REFERENCE.md 7).
    pub status: String,
    /// Attention reason when `needs_attention`.
    pub attention_reason: Option<String>,
    /// The frozen declaration, `None` until materialized.
    pub declaration: Option<Value>,
    /// Chat transcript (JSON array).
    pub transcript: Value,
    /// The last round started.
    pub round: i64,
    /// The final answer.
    pub final_text: Option<String>,
    /// The failure key, when it ended on one.
    pub error_key: Option<String>,
    /// The last event sequence number written.
    pub event_seq: i64,
    /// Creation time.
    pub created_at: i64,
    /// Last update.
    pub updated_at: i64,
}

/// A task: one inbox row (REFERENCE.md 6.5).
#[derive(Clone, Debug, PartialEq)]
pub struct TaskRow {
    /// The execution it belongs to.
    pub run_public_id: Uuid,
    /// `r{round}t{i}`.
    pub task_key: String,
    /// `tool_call`.
    pub kind: String,
    /// The round that fanned it out.
    pub round: i64,
    /// The callable the model called (may be a qualified collision name).
    pub callable_name: String,
    /// The served name the runner runs.
    pub tool_name: String,
    /// The JSON object input.
    pub tool_input: Value,
    /// The provider's call id.
    pub tool_call_id: String,
    /// The frozen target Runner; `None` for kernel-held tasks.
    pub target_executor_public_id: Option<Uuid>,
    /// The served tool's effect profile at freezing.
    pub effect_profile: Option<Value>,
    /// The original budget in milliseconds; never moves.
    pub timeout_ms: i64,
    /// Task status (REFERENCE.md 7).
    pub status: String,
    /// Whether anyone ever claimed it.
    pub claimed: bool,
    /// SHA-256 hex of the current claim token.
    pub claim_token_digest: Option<String>,
    /// When it was dispatched.
    pub started_at: i64,
    /// The park deadline.
    pub deadline_at: i64,
    /// The committed result body.
    pub result: Option<Value>,
    /// The error key of a failed, timed-out or uncertain settle.
    pub error_key: Option<String>,
    /// When it settled.
    pub settled_at: Option<i64>,
    /// The approval fact `{origin, decided_by?, decided_at}` (REFERENCE.md 10); `None` while
    /// parked or when the call failed before the approval stage.
    pub approval: Option<Value>,
}

impl TaskRow {
    /// A fresh `tool_call` row of `run` in `round`, not yet started anywhere: `waiting`, never
    /// claimed, no target, input `{}`, its `tool_call_id` its key, started (and due) at `now`
    /// (Unix milliseconds) with a budget of `timeout_ms`. The round driver, hooks and compaction
    /// set the rest before the row is written.
    pub fn new(run: Uuid, task_key: String, round: i64, tool_name: String, timeout_ms: i64, now: i64) -> TaskRow {
        TaskRow {
            run_public_id: run,
            tool_call_id: task_key.clone(),
            task_key,
            kind: "tool_call".into(),
            round,
            callable_name: tool_name.clone(),
            tool_name,
            tool_input: Value::Object(serde_json::Map::new()),
            target_executor_public_id: None,
            effect_profile: None,
            timeout_ms,
            status: "waiting".into(),
            claimed: false,
            claim_token_digest: None,
            started_at: now,
            deadline_at: now,
            result: None,
            error_key: None,
            settled_at: None,
            approval: None,
        }
    }

    /// Whether the task reached a terminal status.
    pub fn is_settled(&self) -> bool {
        crate::actors::execution::task_status_is_settled(&self.status)
    }
}

/// One durable event.
#[derive(Clone, Debug, PartialEq)]
pub struct EventRow {
    /// Sequence within the execution, from 1.
    pub seq: i64,
    /// The item type.
    pub event_type: String,
    /// The item's JSON data.
    pub data: Value,
    /// Unix milliseconds.
    pub at: i64,
}

/// The store handle. Cheap to clone.
#[derive(Clone, Debug)]
pub struct Store {
    pool: AnyPool,
    backend: StoreBackend,
    /// The group-commit writer of the hot-path writes (tasks, executions, inputs, presence).
    writer: Writer,
}

fn json_opt(text: Option<String>) -> StoreResult<Option<Value>> {
    text.map(|t| serde_json::from_str(&t)).transpose().map_err(StoreError::from)
}

fn uuid_of(text: &str) -> StoreResult<Uuid> {
    Uuid::parse_str(text).map_err(|e| StoreError::Conflict(format!("corrupt uuid {text}: {e}")))
}

fn uuid_opt(text: Option<String>) -> StoreResult<Option<Uuid>> {
    text.as_deref().map(uuid_of).transpose()
}

impl Store {
    /// Opens (creating if needed) the embedded SQLite store `DIR/nexus.db` with the default
    /// settings and runs the embedded migrations.
    ///
    /// The database runs in WAL mode with `synchronous=FULL`, so a write that returned is on disk.
    ///
    /// # Errors
    /// [`StoreError::Open`] naming the data dir when the file cannot be opened or migrated.
    pub async fn open(data_dir: &Path) -> StoreResult<Store> {
        Self::connect(data_dir, &StoreConfig::default()).await
    }

    /// Opens the store that `config` selects: `DIR/nexus.db` (created if needed) when
    /// `database_url` is unset, else the PostgreSQL database it names. Runs the migrations
    /// (on PostgreSQL under sqlx's advisory lock, so nodes starting together migrate once).
    ///
    /// # Errors
    /// [`StoreError::Open`] naming the data dir, or [`StoreError::OpenDatabase`] naming the URL
    /// (password redacted), when the database cannot be opened or migrated.
    pub async fn connect(data_dir: &Path, config: &StoreConfig) -> StoreResult<Store> {
        Self::connect_inner(data_dir, config, true).await
    }

    /// Opens an existing store as [`Store::connect`] does, but never creates one: a typo in a
    /// data dir or URL must not mint credentials into a new, empty store that no server reads
    /// (`nexus admin`).
    ///
    /// # Errors
    /// As [`Store::connect`]; also when `DIR/nexus.db` is missing or the PostgreSQL database holds
    /// no nexus tables.
    pub async fn connect_existing(data_dir: &Path, config: &StoreConfig) -> StoreResult<Store> {
        Self::connect_inner(data_dir, config, false).await
    }

    async fn connect_inner(data_dir: &Path, config: &StoreConfig, create: bool) -> StoreResult<Store> {
        let migrator = sqlx::migrate!("./migrations");
        if let Some(url) = &config.database_url {
            // Name the database in every failure (never its password).
            let open_failed = |reason: String| StoreError::OpenDatabase { url: redact_url(url), reason };
            let pool = backend::open_postgres(url, config.pool_size(), config.acquire_timeout())
                .await
                .map_err(|e| open_failed(e.to_string()))?;
            let writer = Writer::start(pool.clone(), StoreBackend::Postgres);
            let store = Store { pool, backend: StoreBackend::Postgres, writer };
            if !create && !store.has_schema().await.map_err(|e| open_failed(e.to_string()))? {
                return Err(open_failed(
                    "the database holds no nexus store; start `nexus serve` on it once to create it".into(),
                ));
            }
            migrator.run(&store.pool).await.map_err(|e| open_failed(e.to_string()))?;
            return Ok(store);
        }
        // Name the data dir in every failure: "permission denied" alone does not say where.
        let open_failed = |reason: String| StoreError::Open { path: data_dir.to_owned(), reason };
        let path = data_dir.join("nexus.db");
        if create {
            std::fs::create_dir_all(data_dir).map_err(|e| open_failed(e.to_string()))?;
        } else if !path.is_file() {
            return Err(open_failed(format!(
                "there is no nexus store here (no nexus.db); start `nexus serve --data-dir {}` once to create it",
                data_dir.display()
            )));
        }
        let pool = backend::open_sqlite(&path, create, config.pool_size(), config.acquire_timeout())
            .await
            .map_err(|e| open_failed(e.to_string()))?;
        migrator.run(&pool).await.map_err(|e| open_failed(e.to_string()))?;
        let writer = Writer::start(pool.clone(), StoreBackend::Sqlite);
        Ok(Store { pool, backend: StoreBackend::Sqlite, writer })
    }

    /// What group commit has done since the store opened (writes and the transactions they took).
    pub fn group_commit_stats(&self) -> GroupCommitStats {
        self.writer.stats()
    }

    /// Which database serves this store.
    pub fn backend(&self) -> StoreBackend {
        self.backend
    }

    /// Closes every connection; later calls fail. Waits for statements in flight.
    pub async fn close(&self) {
        self.pool.close().await;
    }

    /// Whether the nexus tables exist (the migrations ran here once).
    async fn has_schema(&self) -> StoreResult<bool> {
        let tables = sqlx::query(self.backend.tables_sql()).fetch_all(&self.pool).await?;
        for table in tables {
            if table.try_get::<String, _>("name")? == "_sqlx_migrations" {
                return Ok(true);
            }
        }
        Ok(false)
    }

    // ---- members and credentials -------------------------------------------------------------

    /// Creates a member and its first member-plane credential (stored as a digest).
    ///
    /// # Errors
    /// [`StoreError::Conflict`] when the handle is taken.
    pub async fn create_member(&self, member: &MemberRow, credential: &Credential) -> StoreResult<()> {
        // Write first: a transaction that reads and then writes cannot upgrade its SQLite lock
        // while another writer commits ("database is locked"), so the UNIQUE index decides.
        let mut tx = self.pool.begin().await?;
        let now = now_ms();
        sqlx::query(
            "INSERT INTO members (public_id, kind, handle, display_name, created_at) VALUES ($1, $2, $3, $4, $5)",
        )
        .bind(member.public_id.to_string())
        .bind(&member.kind)
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
        insert_credential(&mut tx, credential, 0).await?;
        if member.kind == "agent" {
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

    /// Creates a runner executor and its transport credential.
    ///
    /// # Errors
    /// [`StoreError`] on a database failure.
    pub async fn create_executor(
        &self,
        public_id: Uuid,
        display_name: &str,
        credential: &Credential,
    ) -> StoreResult<()> {
        let mut tx = self.pool.begin().await?;
        let empty = serde_json::json!({"tools": [], "environment": {}, "documents": []});
        sqlx::query(
            "INSERT INTO executors (public_id, kind, display_name, status, assignment_scope, credential_epoch, announcement, created_at) \
             VALUES ($1, 'runner', $2, 'active', 'account_wide', 0, $3, $4)",
        )
        .bind(public_id.to_string())
        .bind(display_name)
        .bind(empty.to_string())
        .bind(now_ms())
        .execute(&mut *tx)
        .await?;
        insert_credential(&mut tx, credential, 0).await?;
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
        .bind(now_ms())
        .fetch_optional(&self.pool)
        .await?;
        let Some(row) = row else { return Ok(None) };
        let plane: String = row.try_get("plane")?;
        let Some(plane) = Plane::from_word(&plane) else { return Ok(None) };
        Ok(Some((plane, uuid_of(&row.try_get::<String, _>("subject_public_id")?)?, row.try_get("credential_epoch")?)))
    }

    /// Reads a member.
    ///
    /// # Errors
    /// [`StoreError`] on a database failure.
    pub async fn member(&self, public_id: Uuid) -> StoreResult<Option<MemberRow>> {
        let row = sqlx::query("SELECT public_id, kind, handle, display_name, status FROM members WHERE public_id = $1")
            .bind(public_id.to_string())
            .fetch_optional(&self.pool)
            .await?;
        row.map(|row| {
            Ok(MemberRow {
                public_id,
                kind: row.try_get("kind")?,
                handle: row.try_get("handle")?,
                display_name: row.try_get("display_name")?,
                status: row.try_get("status")?,
            })
        })
        .transpose()
    }

    /// Sets a member's standing (`active` or `suspended`). Returns `false` for an unknown member.
    ///
    /// # Errors
    /// [`StoreError`] on a database failure.
    pub async fn set_member_status(&self, public_id: Uuid, status: &str) -> StoreResult<bool> {
        let done = sqlx::query("UPDATE members SET status = $1 WHERE public_id = $2")
            .bind(status)
            .bind(public_id.to_string())
            .execute(&self.pool)
            .await?;
        Ok(done.rows_affected() > 0)
    }

    // ---- profiles ------------------------------------------------------------------------------

    /// Reads an Agent's profile; `None` for a member without one (a Human).
    ///
    /// # Errors
    /// [`StoreError`] on a database failure.
    pub async fn profile(&self, member: Uuid) -> StoreResult<Option<ProfileRow>> {
        let row = sqlx::query(
            "SELECT configuration, system_prompt, system_prompt_version, summarizer, summarizer_version, declared_at \
             FROM profiles WHERE member_public_id = $1",
        )
        .bind(member.to_string())
        .fetch_optional(&self.pool)
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
        member: Uuid,
        configuration: &Value,
        system_prompt: Option<&Value>,
        summarizer: Option<&Value>,
    ) -> StoreResult<ProfileRow> {
        let declared_at = now_ms();
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
        .fetch_optional(&self.pool)
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
    /// [`StoreError`] on a database failure; [`StoreError::Conflict`] for an unknown slot.
    pub async fn set_prompt_document(
        &self,
        member: Uuid,
        slot: &str,
        document: Option<&Value>,
    ) -> StoreResult<ProfileRow> {
        let sql = match slot {
            "system_prompt" => {
                "UPDATE profiles SET system_prompt = $1, system_prompt_version = system_prompt_version + 1 WHERE member_public_id = $2"
            }
            "summarizer" => {
                "UPDATE profiles SET summarizer = $1, summarizer_version = summarizer_version + 1 WHERE member_public_id = $2"
            }
            other => return Err(StoreError::Conflict(format!("no prompt-document slot {other}"))),
        };
        sqlx::query(sql).bind(document.map(Value::to_string)).bind(member.to_string()).execute(&self.pool).await?;
        self.profile(member).await?.ok_or_else(|| StoreError::Conflict("profile vanished".into()))
    }

    // ---- named definitions -----------------------------------------------------------------------

    /// The live (not deleted) named definitions of an Agent, by name.
    ///
    /// # Errors
    /// [`StoreError`] on a database failure.
    pub async fn named_definitions(&self, member: Uuid) -> StoreResult<Vec<NamedDefinitionRow>> {
        let rows = sqlx::query(
            "SELECT name, identifier, scope, description, configuration, display_name, system_prompt, created_at, updated_at \
             FROM named_definitions WHERE member_public_id = $1 AND deleted_at IS NULL ORDER BY name",
        )
        .bind(member.to_string())
        .fetch_all(&self.pool)
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
    pub async fn put_named_definition(&self, member: Uuid, definition: &NamedDefinitionRow) -> StoreResult<bool> {
        let now = now_ms();
        // Write first (replace, else insert): a read-then-write transaction cannot upgrade its
        // SQLite lock while another writer commits.
        let mut tx = self.pool.begin().await?;
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
    pub async fn delete_named_definition(&self, member: Uuid, name: &str) -> StoreResult<bool> {
        let done = sqlx::query(
            "UPDATE named_definitions SET deleted_at = $1 WHERE member_public_id = $2 AND name = $3 AND deleted_at IS NULL",
        )
        .bind(now_ms())
        .bind(member.to_string())
        .bind(name)
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected() > 0)
    }

    /// A digest of every row of every table: equal digests mean nothing was written. Used to prove
    /// that read-only doors (the assembly preview) write nothing.
    ///
    /// # Errors
    /// [`StoreError`] on a database failure.
    pub async fn fingerprint(&self) -> StoreResult<String> {
        use sha2::{Digest, Sha256};
        let mut hasher = Sha256::new();
        let tables = sqlx::query(self.backend.tables_sql()).fetch_all(&self.pool).await?;
        for table in tables {
            let name: String = table.try_get("name")?;
            if name.starts_with("_sqlx") {
                // The migration ledger changes only at start-up, and its timestamp and boolean
                // columns are beyond the Any driver on SQLite.
                continue;
            }
            hasher.update(name.as_bytes());
            // Table names come from the catalog, never from a caller.
            let dump_sql = match self.backend {
                StoreBackend::Sqlite => format!("SELECT * FROM \"{name}\""),
                // Each row as its text literal, in a stable order; this also covers column types
                // (timestamps, bytea) that the Any driver does not decode.
                StoreBackend::Postgres => format!("SELECT t::text AS r FROM \"{name}\" t ORDER BY 1"),
            };
            let dump = sqlx::query(sqlx::AssertSqlSafe(dump_sql)).fetch_all(&self.pool).await?;
            for row in dump {
                for index in 0..row.len() {
                    let cell: Option<String> = row.try_get::<Option<String>, _>(index).unwrap_or(None);
                    let number: Option<i64> = row.try_get::<Option<i64>, _>(index).unwrap_or(None);
                    hasher.update(format!("{cell:?}{number:?}|").as_bytes());
                }
            }
        }
        Ok(hex::encode(hasher.finalize()))
    }

    // ---- executors -----------------------------------------------------------------------------

    /// Reads an executor.
    ///
    /// # Errors
    /// [`StoreError`] on a database failure.
    pub async fn executor(&self, public_id: Uuid) -> StoreResult<Option<ExecutorRow>> {
        let row = sqlx::query(
            "SELECT kind, display_name, status, assignment_scope, credential_epoch, announcement, announced_at, \
             connected_at, last_seen_at FROM executors WHERE public_id = $1",
        )
        .bind(public_id.to_string())
        .fetch_optional(&self.pool)
        .await?;
        row.map(|row| {
            Ok(ExecutorRow {
                public_id,
                kind: row.try_get("kind")?,
                display_name: row.try_get("display_name")?,
                status: row.try_get("status")?,
                assignment_scope: row.try_get("assignment_scope")?,
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
    pub async fn set_announcement(&self, public_id: Uuid, announcement: &Value) -> StoreResult<()> {
        sqlx::query("UPDATE executors SET announcement = $1, announced_at = $2 WHERE public_id = $3")
            .bind(announcement.to_string())
            .bind(now_ms())
            .bind(public_id.to_string())
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    /// Records a stream's Hello (`connected_at`) and presence (`last_seen_at`).
    ///
    /// # Errors
    /// [`StoreError`] on a database failure.
    pub async fn touch_executor(&self, public_id: Uuid, presence: PresenceEvent) -> StoreResult<()> {
        let sql = match presence {
            PresenceEvent::Attached => "UPDATE executors SET connected_at = $1, last_seen_at = $1 WHERE public_id = $2",
            PresenceEvent::Seen => "UPDATE executors SET last_seen_at = $1 WHERE public_id = $2",
            PresenceEvent::Detached => {
                "UPDATE executors SET connected_at = NULL, last_seen_at = $1 WHERE public_id = $2"
            }
        };
        let at = now_ms();
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
        let rows =
            sqlx::query("SELECT public_id FROM executors ORDER BY created_at, public_id").fetch_all(&self.pool).await?;
        let mut executors = Vec::with_capacity(rows.len());
        for row in rows {
            if let Some(executor) = self.executor(uuid_of(&row.try_get::<String, _>("public_id")?)?).await? {
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
    pub async fn repair_executor(&self, public_id: Uuid, credential: &Credential) -> StoreResult<Option<i64>> {
        let mut tx = self.pool.begin().await?;
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
        insert_credential(&mut tx, credential, epoch).await?;
        tx.commit().await?;
        Ok(Some(epoch))
    }

    /// Revokes a runner for good: it is no longer eligible for claims or dispatch. Returns `false`
    /// for an unknown runner.
    ///
    /// # Errors
    /// [`StoreError`] on a database failure.
    pub async fn revoke_executor(&self, public_id: Uuid) -> StoreResult<bool> {
        let done = sqlx::query("UPDATE executors SET status = 'revoked' WHERE public_id = $1")
            .bind(public_id.to_string())
            .execute(&self.pool)
            .await?;
        Ok(done.rows_affected() > 0)
    }

    // ---- conversations, inputs, executions -----------------------------------------------------

    /// Admits an input: creates the conversation when new, the input and its pending execution,
    /// in one transaction.
    ///
    /// # Errors
    /// [`StoreError`] on a database failure.
    pub async fn admit_input(
        &self,
        input: &InputRow,
        new_conversation: bool,
        execution_public_id: Uuid,
    ) -> StoreResult<()> {
        // Group-committed: answered once the batch holding this write is durable.
        let input = Arc::new(input.clone());
        let now = now_ms();
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
    pub async fn conversation_owned_by(&self, conversation: Uuid, member: Uuid) -> StoreResult<bool> {
        let row = sqlx::query("SELECT 1 FROM conversations WHERE public_id = $1 AND member_public_id = $2")
            .bind(conversation.to_string())
            .bind(member.to_string())
            .fetch_optional(&self.pool)
            .await?;
        Ok(row.is_some())
    }

    /// Reads an input.
    ///
    /// # Errors
    /// [`StoreError`] on a database failure.
    pub async fn input(&self, public_id: Uuid) -> StoreResult<Option<InputRow>> {
        let row = sqlx::query(
            "SELECT conversation_public_id, member_public_id, text, execution_declaration, runner_executor_public_id, \
             tool_names FROM inputs WHERE public_id = $1",
        )
        .bind(public_id.to_string())
        .fetch_optional(&self.pool)
        .await?;
        row.map(|row| {
            Ok(InputRow {
                public_id,
                conversation_public_id: uuid_of(&row.try_get::<String, _>("conversation_public_id")?)?,
                member_public_id: uuid_of(&row.try_get::<String, _>("member_public_id")?)?,
                text: row.try_get("text")?,
                execution_declaration: json_opt(row.try_get("execution_declaration")?)?,
                runner_executor_public_id: uuid_opt(row.try_get("runner_executor_public_id")?)?,
                tool_names: json_opt(row.try_get("tool_names")?)?,
            })
        })
        .transpose()
    }

    /// Reads an execution.
    ///
    /// # Errors
    /// [`StoreError`] on a database failure.
    pub async fn execution(&self, public_id: Uuid) -> StoreResult<Option<ExecutionRow>> {
        let row = sqlx::query(
            "SELECT conversation_public_id, input_public_id, member_public_id, status, attention_reason, declaration, \
             transcript, round, final_text, error_key, event_seq, created_at, updated_at FROM executions WHERE public_id = $1",
        )
        .bind(public_id.to_string())
        .fetch_optional(&self.pool)
        .await?;
        row.map(|row| {
            Ok(ExecutionRow {
                public_id,
                conversation_public_id: uuid_of(&row.try_get::<String, _>("conversation_public_id")?)?,
                input_public_id: uuid_of(&row.try_get::<String, _>("input_public_id")?)?,
                member_public_id: uuid_of(&row.try_get::<String, _>("member_public_id")?)?,
                status: row.try_get("status")?,
                attention_reason: row.try_get("attention_reason")?,
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
    pub async fn live_executions(&self) -> StoreResult<Vec<Uuid>> {
        let rows = sqlx::query("SELECT public_id FROM executions WHERE status IN ('pending', 'running', 'canceling')")
            .fetch_all(&self.pool)
            .await?;
        rows.iter().map(|r| uuid_of(&r.try_get::<String, _>("public_id")?)).collect()
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
        self.writer
            .write(move |connection| {
                let write = write.clone();
                Box::pin(async move {
                    let (execution, new_tasks, new_events) = &*write;
                    save_execution_in(connection, execution, new_tasks, new_events).await
                })
            })
            .await
    }

    /// Creates an execution of an input that already has one (a regeneration, REFERENCE.md 8):
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
                    .bind(&execution.status)
                    .bind(execution.created_at)
                    .bind(execution.created_at)
                    .execute(&mut *connection)
                    .await?;
                    save_execution_in(connection, execution, &[], events).await
                })
            })
            .await
    }

    /// Events after `after_seq`, oldest first, at most `limit`.
    ///
    /// # Errors
    /// [`StoreError`] on a database failure.
    pub async fn events_after(&self, execution: Uuid, after_seq: i64, limit: i64) -> StoreResult<Vec<EventRow>> {
        let rows = sqlx::query(
            "SELECT seq, type, data, at FROM events WHERE execution_public_id = $1 AND seq > $2 ORDER BY seq LIMIT $3",
        )
        .bind(execution.to_string())
        .bind(after_seq)
        .bind(limit)
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|row| {
                Ok(EventRow {
                    seq: row.try_get("seq")?,
                    event_type: row.try_get("type")?,
                    data: serde_json::from_str(&row.try_get::<String, _>("data")?)?,
                    at: row.try_get("at")?,
                })
            })
            .collect()
    }

    // ---- tasks ---------------------------------------------------------------------------------

    /// Reads one task.
    ///
    /// # Errors
    /// [`StoreError`] on a database failure.
    pub async fn task(&self, run: Uuid, task_key: &str) -> StoreResult<Option<TaskRow>> {
        let row = sqlx::query(concat!(task_select!(), " WHERE run_public_id = $1 AND task_key = $2"))
            .bind(run.to_string())
            .bind(task_key)
            .fetch_optional(&self.pool)
            .await?;
        row.as_ref().map(task_of).transpose()
    }

    /// Every task of an execution, by round then key.
    ///
    /// # Errors
    /// [`StoreError`] on a database failure.
    pub async fn tasks_of(&self, run: Uuid) -> StoreResult<Vec<TaskRow>> {
        let rows = sqlx::query(concat!(task_select!(), " WHERE run_public_id = $1 ORDER BY round, task_key"))
            .bind(run.to_string())
            .fetch_all(&self.pool)
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
    pub async fn open_tasks_for(&self, executor: Uuid) -> StoreResult<Vec<TaskRow>> {
        let rows = sqlx::query(concat!(
            task_select!(),
            " WHERE target_executor_public_id = $1 AND status IN ('dispatched', 'running') ORDER BY started_at, task_key"
        ))
        .bind(executor.to_string())
        .fetch_all(&self.pool)
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
    pub async fn executors_with_open_tasks(&self) -> StoreResult<Vec<Uuid>> {
        let rows = sqlx::query(
            "SELECT DISTINCT target_executor_public_id AS id FROM tasks \
             WHERE status IN ('dispatched', 'running') AND target_executor_public_id IS NOT NULL",
        )
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(|r| uuid_of(&r.try_get::<String, _>("id")?)).collect()
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

    /// Writes the approval stage's decision on a parked task (REFERENCE.md 10): its status,
    /// effect profile, start, deadline, result, error key, settlement and approval fact.
    ///
    /// The write is conditional: it applies only while the stored row is `needs_approval`, so of
    /// two deciders (an approval and an expiry, or two nexus nodes) exactly one wins. Answers
    /// whether this one did.
    ///
    /// # Errors
    /// [`StoreError`] on a database failure.
    pub async fn decide_task(&self, task: &TaskRow) -> StoreResult<bool> {
        let task = Arc::new(task.clone());
        self.writer
            .write(move |connection| {
                let task = task.clone();
                Box::pin(async move {
                    let written = sqlx::query(
                        "UPDATE tasks SET status = $1, effect_profile = $2, started_at = $3, deadline_at = $4, \
                         result = $5, error_key = $6, settled_at = $7, approval = $8 \
                         WHERE run_public_id = $9 AND task_key = $10 AND status = 'needs_approval'",
                    )
                    .bind(&task.status)
                    .bind(task.effect_profile.as_ref().map(Value::to_string))
                    .bind(task.started_at)
                    .bind(task.deadline_at)
                    .bind(task.result.as_ref().map(Value::to_string))
                    .bind(&task.error_key)
                    .bind(task.settled_at)
                    .bind(task.approval.as_ref().map(Value::to_string))
                    .bind(task.run_public_id.to_string())
                    .bind(&task.task_key)
                    .execute(&mut *connection)
                    .await?;
                    Ok(written.rows_affected() == 1)
                })
            })
            .await
    }

    /// Starts a task that was written `waiting` (a compaction's summary task, REFERENCE.md 13):
    /// writes its kind, names, input, target, effect profile, budget, status, start, deadline,
    /// result, error key, settlement and approval fact as `task` holds them.
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
                    .bind(&task.kind)
                    .bind(&task.callable_name)
                    .bind(&task.tool_name)
                    .bind(task.tool_input.to_string())
                    .bind(task.target_executor_public_id.map(|u| u.to_string()))
                    .bind(task.effect_profile.as_ref().map(Value::to_string))
                    .bind(task.timeout_ms)
                    .bind(&task.status)
                    .bind(task.started_at)
                    .bind(task.deadline_at)
                    .bind(task.result.as_ref().map(Value::to_string))
                    .bind(&task.error_key)
                    .bind(task.settled_at)
                    .bind(task.approval.as_ref().map(Value::to_string))
                    .bind(task.run_public_id.to_string())
                    .bind(&task.task_key)
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
    .bind(&task.status)
    .bind(i64::from(task.claimed))
    .bind(&task.claim_token_digest)
    .bind(task.deadline_at)
    .bind(task.result.as_ref().map(Value::to_string))
    .bind(&task.error_key)
    .bind(task.settled_at)
    .bind(task.run_public_id.to_string())
    .bind(&task.task_key)
    .execute(&mut *connection)
    .await?;
    if written.rows_affected() == 0 && task_exists(connection, task.run_public_id, &task.task_key).await? {
        return Err(StoreError::Conflict(format!(
            "task {} of run {} holds another claim; this write came from a stale copy",
            task.task_key, task.run_public_id
        )));
    }
    Ok(())
}

/// [`Store::save_execution`]'s statements, on the writer's transaction.
async fn save_execution_in(
    connection: &mut AnyConnection,
    execution: &ExecutionRow,
    new_tasks: &[TaskRow],
    new_events: &[EventRow],
) -> StoreResult<()> {
    sqlx::query(
        "UPDATE executions SET status = $1, attention_reason = $2, declaration = COALESCE($3, declaration), transcript = $4, round = $5, \
         final_text = $6, error_key = $7, event_seq = $8, updated_at = $9 WHERE public_id = $10",
    )
    .bind(&execution.status)
    .bind(&execution.attention_reason)
    .bind(execution.declaration.as_ref().map(Value::to_string))
    .bind(execution.transcript.to_string())
    .bind(execution.round)
    .bind(&execution.final_text)
    .bind(&execution.error_key)
    .bind(execution.event_seq)
    .bind(now_ms())
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
            .bind(&event.event_type)
            .bind(event.data.to_string())
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
    execution_public_id: Uuid,
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

async fn task_exists(connection: &mut AnyConnection, run: Uuid, task_key: &str) -> StoreResult<bool> {
    let row = sqlx::query("SELECT 1 FROM tasks WHERE run_public_id = $1 AND task_key = $2")
        .bind(run.to_string())
        .bind(task_key)
        .fetch_optional(&mut *connection)
        .await?;
    Ok(row.is_some())
}

fn task_of(row: &AnyRow) -> StoreResult<TaskRow> {
    Ok(TaskRow {
        run_public_id: uuid_of(&row.try_get::<String, _>("run_public_id")?)?,
        task_key: row.try_get("task_key")?,
        kind: row.try_get("kind")?,
        round: row.try_get("round")?,
        callable_name: row.try_get("callable_name")?,
        tool_name: row.try_get("tool_name")?,
        tool_input: serde_json::from_str(&row.try_get::<String, _>("tool_input")?)?,
        tool_call_id: row.try_get("tool_call_id")?,
        target_executor_public_id: uuid_opt(row.try_get("target_executor_public_id")?)?,
        effect_profile: json_opt(row.try_get("effect_profile")?)?,
        timeout_ms: row.try_get("timeout_ms")?,
        status: row.try_get("status")?,
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

async fn insert_task(connection: &mut AnyConnection, task: &TaskRow) -> StoreResult<()> {
    sqlx::query(
        "INSERT INTO tasks (run_public_id, task_key, kind, round, callable_name, tool_name, tool_input, tool_call_id, \
         target_executor_public_id, effect_profile, timeout_ms, status, claimed, claim_token_digest, started_at, \
         deadline_at, result, error_key, settled_at, approval) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19, $20)",
    )
    .bind(task.run_public_id.to_string())
    .bind(&task.task_key)
    .bind(&task.kind)
    .bind(task.round)
    .bind(&task.callable_name)
    .bind(&task.tool_name)
    .bind(task.tool_input.to_string())
    .bind(&task.tool_call_id)
    .bind(task.target_executor_public_id.map(|u| u.to_string()))
    .bind(task.effect_profile.as_ref().map(Value::to_string))
    .bind(task.timeout_ms)
    .bind(&task.status)
    .bind(i64::from(task.claimed))
    .bind(&task.claim_token_digest)
    .bind(task.started_at)
    .bind(task.deadline_at)
    .bind(task.result.as_ref().map(Value::to_string))
    .bind(&task.error_key)
    .bind(task.settled_at)
    .bind(task.approval.as_ref().map(Value::to_string))
    .execute(&mut *connection)
    .await?;
    Ok(())
}

async fn insert_credential(
    tx: &mut sqlx::Transaction<'_, Any>,
    credential: &Credential,
    epoch: i64,
) -> StoreResult<()> {
    sqlx::query(
        "INSERT INTO credentials (digest, plane, subject_public_id, credential_epoch, created_at) VALUES ($1, $2, $3, $4, $5)",
    )
    .bind(&credential.digest)
    .bind(credential.plane.as_str())
    .bind(credential.subject.to_string())
    .bind(epoch)
    .bind(now_ms())
    .execute(&mut **tx)
    .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn sqlite_acknowledges_only_durable_writes() {
        let dir = tempfile::tempdir().expect("temp dir");
        let store = Store::open(dir.path()).await.expect("opens");
        assert_eq!(store.backend(), StoreBackend::Sqlite);
        // Every pooled connection, not only the first, runs with the durable settings.
        for _ in 0..3 {
            let mut connection = store.pool.acquire().await.expect("connection");
            let mode: String =
                sqlx::query("PRAGMA journal_mode").fetch_one(&mut *connection).await.expect("mode").get(0);
            let synchronous: i64 =
                sqlx::query("PRAGMA synchronous").fetch_one(&mut *connection).await.expect("sync").get(0);
            let busy: i64 = sqlx::query("PRAGMA busy_timeout").fetch_one(&mut *connection).await.expect("busy").get(0);
            assert_eq!((mode.as_str(), synchronous, busy), ("wal", 2, 10_000));
        }
        store.close().await;
        // The same file opens again with its data, and an existing store is found.
        let again = Store::connect_existing(dir.path(), &StoreConfig::default()).await.expect("reopens");
        assert_eq!(again.fingerprint().await.expect("fingerprint").len(), 64);
    }

    #[tokio::test]
    async fn opening_failures_name_the_place_and_never_the_password() {
        let missing = tempfile::tempdir().expect("temp dir");
        let error = Store::connect_existing(missing.path(), &StoreConfig::default()).await.expect_err("no store");
        assert!(matches!(&error, StoreError::Open { path, .. } if path == missing.path()), "{error}");
        assert!(error.to_string().contains("nexus serve"), "{error}");

        // Port 1 on loopback refuses at once.
        let config = StoreConfig {
            database_url: Some("postgres://nexus:s3cret@127.0.0.1:1/nexus".into()),
            acquire_timeout_ms: 500,
            ..StoreConfig::default()
        };
        let error = Store::connect(missing.path(), &config).await.expect_err("nothing listens");
        let StoreError::OpenDatabase { url, .. } = &error else { panic!("{error}") };
        assert_eq!(url, "postgres://nexus:***@127.0.0.1:1/nexus");
        assert!(!error.to_string().contains("s3cret"), "{error}");
    }
}
