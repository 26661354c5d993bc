//! The durable store: one [`Store`] interface over two backends, the embedded SQLite file in the
//! data dir (the default) and PostgreSQL, each served by one node at a time ([`ServeLock`]).
//!
//! Everything that must survive a restart is written here before it is acknowledged
//! (`docs/architecture.md`, "Durability"). Both backends run the same migrations from `migrations/`, which are portable
//! SQL (TEXT and BIGINT only), and the same statement texts through sqlx's `Any` driver; only the
//! opening and the catalog queries differ (the `backend` submodule). Times are Unix milliseconds;
//! booleans are 0/1.

mod assignments;
mod backend;
pub mod children;
mod config;
mod conversations;
pub mod event;
mod executions;
mod executors;
mod grants;
mod history;
pub mod lease;
pub mod lock;
mod members;
mod memory;
mod profiles;
pub mod queue;
mod rows;
mod save_bytes;
mod sessions;
mod tally;
mod tasks;
mod writer;

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use serde_json::Value;
use sqlx::{AnyPool, Row};

use nexus_proto::ExecutionId;

use crate::auth::{Credential, Plane};
use crate::clock::Clock;

pub use assignments::RunnerAssignment;
pub use backend::{StoreBackend, is_postgres_url, redact as redact_url};
pub use config::StoreConfig;
pub use conversations::{ConversationSummary, ExecutionFilter, ExecutionSummary, Keyset, TurnRow};
pub use event::{Event, EventType};
pub use executions::TranscriptWrite;
pub use grants::GrantRow;
pub use history::HISTORY_TURNS_BOUND;
pub use lock::{LockError, ServeLock};
pub use memory::{
    Expected as MemoryExpected, MemoryAuthor, MemoryChange, MemoryDocument, MemoryRevision, MemoryWritten,
    REVISIONS_BOUND as MEMORY_REVISIONS_BOUND,
};
pub use rows::{
    EventRow, ExecutionRow, ExecutorRow, InputRow, MemberRow, NamedDefinitionRow, PresenceEvent, ProfileRow, TaskRow,
};
pub use save_bytes::{RECENT_ROUNDS as SAVE_BYTES_RECENT_ROUNDS, SaveBytes};
pub use sessions::{Reachable, SESSION_TEXT_CUT, TurnCursor, TurnText};
pub use tally::{RunnerTally, Tally};
pub use writer::{CommitMetrics, GroupCommitStats, MAX_BATCH as GROUP_COMMIT_MAX_BATCH};

use save_bytes::SaveLedger;
use writer::Writer;

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
    /// A stored word (an id, a status, a kind, a task key) did not parse.
    #[error("store: corrupt row: {0}")]
    Corrupt(String),
    /// This node lost the serve lease (`store::lease`): another node took its work over, so
    /// the write was refused and the node stops serving.
    #[error("fenced: {0}")]
    Fenced(String),
}

/// Result alias for store calls.
pub type StoreResult<T> = Result<T, StoreError>;

/// The store handle. Cheap to clone.
#[derive(Clone, Debug)]
pub struct Store {
    pool: AnyPool,
    backend: StoreBackend,
    /// The time the store stamps rows with.
    clock: Clock,
    /// The group-commit writer of the hot-path writes (tasks, executions, inputs, presence).
    writer: Writer,
    /// What execution saves have written ([`Store::save_bytes`]).
    saves: Arc<SaveLedger>,
    /// Reads and direct (not group-committed) writes, counted for [`Store::io_stats`].
    io: Arc<IoCounters>,
    /// The serve lease's fence the writer checks (PostgreSQL, once held; `store::lease`).
    fence: lease::FenceSlot,
}

#[derive(Debug, Default)]
struct IoCounters {
    reads: AtomicU64,
    direct_writes: AtomicU64,
}

/// The store's traffic since it opened (issue 10: "store writes and reads per settled call").
///
/// A write is one unit of work handed to the database: a group-committed job (a task's claim, a
/// settlement, one execution save with its new tasks and events) or a direct statement or
/// transaction (presence, admin); a read is one query outside a write. Both are cumulative
/// counts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IoStats {
    /// Queries that read.
    pub reads: u64,
    /// Writes, group-committed or direct.
    pub writes: u64,
    /// Committed group-commit transactions (disk flushes of the writer).
    pub transactions: u64,
}

/// The `VALUES` list of a multi-row INSERT: `rows` tuples of `columns` placeholders, numbered
/// from `$1` (both backends read `$N`). One statement for many rows spares a round trip per row
/// to the database (for SQLite, to sqlx's worker thread).
pub(super) fn values_list(rows: usize, columns: usize) -> String {
    let mut sql = String::with_capacity(rows * columns * 5);
    for row in 0..rows {
        if row > 0 {
            sql.push_str(", ");
        }
        sql.push('(');
        for column in 0..columns {
            if column > 0 {
                sql.push_str(", ");
            }
            sql.push('$');
            sql.push_str(&(row * columns + column + 1).to_string());
        }
        sql.push(')');
    }
    sql
}

fn json_opt(text: Option<String>) -> StoreResult<Option<Value>> {
    text.map(|t| serde_json::from_str(&t)).transpose().map_err(StoreError::from)
}

/// Reads an optional JSON text column into its type.
fn json_typed<T: serde::de::DeserializeOwned>(text: Option<String>) -> StoreResult<Option<T>> {
    text.map(|t| serde_json::from_str(&t)).transpose().map_err(StoreError::from)
}

/// Reads a stored word (an id, a status, a kind, a task key) back into its type.
fn parse<T>(text: &str) -> StoreResult<T>
where
    T: std::str::FromStr,
    T::Err: std::fmt::Display,
{
    text.parse().map_err(|e| StoreError::Corrupt(format!("{text:?}: {e}")))
}

fn parse_opt<T>(text: Option<String>) -> StoreResult<Option<T>>
where
    T: std::str::FromStr,
    T::Err: std::fmt::Display,
{
    text.as_deref().map(parse).transpose()
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
            let fence = lease::FenceSlot::default();
            let writer = Writer::start(pool.clone(), StoreBackend::Postgres, fence.clone());
            let store = Store {
                pool,
                backend: StoreBackend::Postgres,
                clock: Clock::system(),
                writer,
                saves: Arc::default(),
                io: Arc::default(),
                fence,
            };
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
        let fence = lease::FenceSlot::default();
        let writer = Writer::start(pool.clone(), StoreBackend::Sqlite, fence.clone());
        Ok(Store {
            pool,
            backend: StoreBackend::Sqlite,
            clock: Clock::system(),
            writer,
            saves: Arc::default(),
            io: Arc::default(),
            fence,
        })
    }

    /// This store, stamping rows with `clock` (the server's, so that stored times and deadlines
    /// read one time).
    #[must_use]
    pub fn with_clock(mut self, clock: Clock) -> Store {
        self.clock = clock;
        self
    }

    /// Fences every later group-committed write of this store (and of its clones) with `fence`:
    /// each transaction first checks that the serve lease still names this node at its
    /// generation, unexpired, and is refused with [`StoreError::Fenced`] otherwise. Set once;
    /// a second call is ignored (a node holds one lease for its life).
    pub fn fence_with(&self, fence: std::sync::Arc<lease::Fence>) {
        let _ = self.fence.set(fence);
    }

    /// The clock the store stamps rows with.
    pub fn clock(&self) -> &Clock {
        &self.clock
    }

    /// The group commit's histograms (`/metrics`, `docs/metrics.md`).
    pub fn commit_metrics(&self) -> CommitMetrics {
        self.writer.metrics()
    }

    /// Reads and writes since the store opened ([`IoStats`]).
    pub fn io_stats(&self) -> IoStats {
        let group = self.writer.stats();
        IoStats {
            reads: self.io.reads.load(Ordering::Relaxed),
            writes: group.writes + self.io.direct_writes.load(Ordering::Relaxed),
            transactions: group.transactions,
        }
    }

    /// The pool, for one read (counted).
    fn reader(&self) -> &AnyPool {
        self.io.reads.fetch_add(1, Ordering::Relaxed);
        &self.pool
    }

    /// The pool, for one write outside group commit (counted).
    fn direct_writer(&self) -> &AnyPool {
        self.io.direct_writes.fetch_add(1, Ordering::Relaxed);
        &self.pool
    }

    /// What group commit has done since the store opened (writes and the transactions they took).
    pub fn group_commit_stats(&self) -> GroupCommitStats {
        self.writer.stats()
    }

    /// What execution saves have written since the store opened: how many, and the bytes of the
    /// text they bound (`docs/architecture.md`, "Transcript storage").
    pub fn save_bytes(&self) -> SaveBytes {
        self.saves.total()
    }

    /// What the saves of `execution` wrote while its row stood at `round` (the round it had
    /// started last); `None` when it saved nothing there, or when that pair is older than the
    /// [`SAVE_BYTES_RECENT_ROUNDS`] most recent ones the store keeps.
    pub fn round_save_bytes(&self, execution: ExecutionId, round: i64) -> Option<SaveBytes> {
        self.saves.of_round(execution, round)
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
        let tables = sqlx::query(self.backend.tables_sql()).fetch_all(self.reader()).await?;
        for table in tables {
            if table.try_get::<String, _>("name")? == "_sqlx_migrations" {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// A digest of every row of every table: equal digests mean nothing was written. Used to prove
    /// that read-only doors (the assembly preview) write nothing.
    ///
    /// # Errors
    /// [`StoreError`] on a database failure.
    pub async fn fingerprint(&self) -> StoreResult<String> {
        use sha2::{Digest, Sha256};
        let mut hasher = Sha256::new();
        let tables = sqlx::query(self.backend.tables_sql()).fetch_all(self.reader()).await?;
        for table in tables {
            let name: String = table.try_get("name")?;
            if name.starts_with("_sqlx") || name.starts_with("cluster_") {
                // The migration ledger changes only at start-up, and its timestamp and boolean
                // columns are beyond the Any driver on SQLite. The cluster tables are liveness,
                // not data: the lease holder and every standby write their heartbeat there
                // several times a term (`docs/cluster.md`).
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
            let dump = sqlx::query(sqlx::AssertSqlSafe(dump_sql)).fetch_all(self.reader()).await?;
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
        // The cause, not the pool's "timed out".
        assert!(!error.to_string().contains("pool timed out"), "{error}");
        assert!(error.to_string().to_lowercase().contains("refused"), "{error}");
    }

    #[test]
    fn a_values_list_numbers_every_placeholder_once_row_by_row() {
        assert_eq!(values_list(1, 3), "($1, $2, $3)");
        assert_eq!(values_list(2, 2), "($1, $2), ($3, $4)");
    }
}
