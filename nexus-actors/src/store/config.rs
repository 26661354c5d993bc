//! Where the store lives and how it connects: `[store]` of the server configuration.

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Where the durable store lives (see README, "Store"). One schema and one `Store` interface
/// serve both backends.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct StoreConfig {
    /// The database. Default: unset, the embedded SQLite file `DATA_DIR/nexus.db`.
    /// `postgres://USER[:PASSWORD]@HOST[:PORT]/DATABASE[?sslmode=...]` (or `postgresql://`)
    /// selects PostgreSQL: the database must exist, and nexus creates and migrates its tables.
    /// Several nodes may share one PostgreSQL database: one holds its serve lease and drives the
    /// work, the others wait as standbys (`docs/cluster.md`). The flag `--database-url` and
    /// `NEXUS_DATABASE_URL` override it.
    pub database_url: Option<String>,
    /// Most open connections to the database, a count. Default: unset, which is 4 on SQLite (one
    /// writer at a time) and 16 on PostgreSQL.
    pub max_connections: Option<u32>,
    /// Bound on opening a connection or waiting for a free one, in milliseconds. Default 10000.
    pub acquire_timeout_ms: u64,
}

impl Default for StoreConfig {
    fn default() -> Self {
        StoreConfig { database_url: None, max_connections: None, acquire_timeout_ms: 10_000 }
    }
}

// By hand, so that a password in the URL never reaches a log line through `{:?}`.
impl std::fmt::Debug for StoreConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoreConfig")
            .field("database_url", &self.database_url.as_deref().map(super::redact_url))
            .field("max_connections", &self.max_connections)
            .field("acquire_timeout_ms", &self.acquire_timeout_ms)
            .finish()
    }
}

impl StoreConfig {
    /// The backend the configuration selects.
    pub fn backend(&self) -> super::StoreBackend {
        match &self.database_url {
            Some(_) => super::StoreBackend::Postgres,
            None => super::StoreBackend::Sqlite,
        }
    }

    /// The pool size: `max_connections`, or the backend's default.
    pub fn pool_size(&self) -> u32 {
        self.max_connections.unwrap_or_else(|| self.backend().default_max_connections())
    }

    /// The connection bound as a duration.
    pub fn acquire_timeout(&self) -> Duration {
        Duration::from_millis(self.acquire_timeout_ms.max(1))
    }
}
