//! The two store backends behind one [`AnyPool`]: the embedded SQLite file (the default) and
//! PostgreSQL (a database you already run; one node serves it at a time, see `store::lock`).
//!
//! Every statement of the store is written once, with `$1, $2, ...` placeholders: PostgreSQL
//! requires them, and sqlx's SQLite driver binds `$N` by its number as well, so no query text is
//! rewritten or duplicated per backend. What truly differs lives here: how a connection is opened
//! and tuned, and the catalog queries of [`Store::fingerprint`](super::Store::fingerprint).

use std::path::Path;
use std::time::Duration;

use futures::future::BoxFuture;
use sqlx::any::{AnyConnectOptions, AnyPoolOptions};
use sqlx::sqlite::SqliteConnectOptions;
use sqlx::{AnyConnection, AnyPool, ConnectOptions, Executor};

/// Which database serves the store.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum StoreBackend {
    /// The embedded SQLite file `DATA_DIR/nexus.db`.
    Sqlite,
    /// A PostgreSQL database named by a `postgres://` URL.
    Postgres,
}

impl StoreBackend {
    /// `sqlite` or `postgres`.
    pub fn as_str(self) -> &'static str {
        match self {
            StoreBackend::Sqlite => "sqlite",
            StoreBackend::Postgres => "postgres",
        }
    }

    /// The pool size when the configuration leaves it unset: SQLite takes one writer at a time,
    /// so a few connections serve its readers; PostgreSQL runs writers side by side.
    pub fn default_max_connections(self) -> u32 {
        match self {
            StoreBackend::Sqlite => 4,
            StoreBackend::Postgres => 16,
        }
    }

    /// The statement that opens a read transaction whose statements all see one snapshot:
    /// SQLite's deferred transaction reads one WAL snapshot from its first read on; PostgreSQL's
    /// default isolation (read committed) takes one per statement, so it asks for repeatable read.
    pub(super) fn snapshot_sql(self) -> &'static str {
        match self {
            StoreBackend::Sqlite => "BEGIN",
            StoreBackend::Postgres => "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY",
        }
    }

    /// The statement that lists the store's tables as one `name` column, sorted.
    pub(super) fn tables_sql(self) -> &'static str {
        match self {
            StoreBackend::Sqlite => "SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name",
            StoreBackend::Postgres => {
                "SELECT tablename::text AS name FROM pg_tables WHERE schemaname = current_schema() ORDER BY 1"
            }
        }
    }
}

/// Whether a database URL selects PostgreSQL (`postgres://` or `postgresql://`).
pub fn is_postgres_url(url: &str) -> bool {
    url.starts_with("postgres://") || url.starts_with("postgresql://")
}

/// The URL with its password replaced by `***`, fit for logs and error messages.
pub fn redact(url: &str) -> String {
    let shown = redact_userinfo(url);
    // `?password=...` is the other place a libpq-style URL may carry one.
    let Some(query_start) = shown.find('?') else { return shown };
    let (base, query) = shown.split_at(query_start + 1);
    let pairs: Vec<String> = query
        .split('&')
        .map(|pair| if pair.starts_with("password=") { "password=***".to_owned() } else { pair.to_owned() })
        .collect();
    format!("{base}{}", pairs.join("&"))
}

fn redact_userinfo(url: &str) -> String {
    let Some(scheme_end) = url.find("://") else { return url.to_owned() };
    let rest = &url[scheme_end + 3..];
    let authority_end = rest.find(['/', '?']).unwrap_or(rest.len());
    let authority = &rest[..authority_end];
    let Some(at) = authority.rfind('@') else { return url.to_owned() };
    let Some(colon) = authority[..at].find(':') else { return url.to_owned() };
    format!("{}{}:***{}", &url[..scheme_end + 3], &authority[..colon], &url[scheme_end + 3 + at..])
}

/// Opens `path`, creating it when `create` is set, in WAL mode with `synchronous=FULL`: a write
/// that returned is on disk. Writers wait up to 10 s for one another (the busy timeout).
pub(super) async fn open_sqlite(
    path: &Path,
    create: bool,
    max_connections: u32,
    acquire_timeout: Duration,
) -> Result<AnyPool, sqlx::Error> {
    sqlx::any::install_default_drivers();
    // Built from the typed options so that a path with spaces, `?` or `#` is encoded correctly.
    let url = SqliteConnectOptions::new().filename(path).create_if_missing(create).to_url_lossy();
    let options = AnyConnectOptions::from_url(&url)?;
    // The Any driver takes only a URL, so the pragmas that make acknowledgements durable are set
    // on every new connection (journal_mode sticks to the file; the others are per connection).
    AnyPoolOptions::new()
        .max_connections(max_connections)
        .acquire_timeout(acquire_timeout)
        .after_connect(|connection: &mut AnyConnection, _| -> BoxFuture<'_, Result<(), sqlx::Error>> {
            Box::pin(async move {
                for pragma in [
                    "PRAGMA busy_timeout = 10000",
                    "PRAGMA journal_mode = WAL",
                    "PRAGMA synchronous = FULL",
                    "PRAGMA foreign_keys = ON",
                ] {
                    connection.execute(pragma).await?;
                }
                Ok(())
            })
        })
        .connect_with(options)
        .await
}

/// Connects to a PostgreSQL database. The database must exist; its tables are created by the
/// migrations. Durability is PostgreSQL's own (`synchronous_commit`, on by default).
pub(super) async fn open_postgres(
    url: &str,
    max_connections: u32,
    acquire_timeout: Duration,
) -> Result<AnyPool, sqlx::Error> {
    sqlx::any::install_default_drivers();
    let opened =
        AnyPoolOptions::new().max_connections(max_connections).acquire_timeout(acquire_timeout).connect(url).await;
    match opened {
        // The pool retries a failing connection until its bound and then says only that it timed
        // out: one more connection, bounded the same way, says why (refused, no such host, bad
        // password), which is what the operator needs.
        Err(sqlx::Error::PoolTimedOut) => {
            use sqlx::Connection;
            match tokio::time::timeout(acquire_timeout, sqlx::AnyConnection::connect(url)).await {
                Ok(Err(cause)) => Err(cause),
                Ok(Ok(_)) | Err(_) => Err(sqlx::Error::PoolTimedOut),
            }
        }
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_never_reach_a_message() {
        let rows = [
            ("postgres://nexus:s3cret@db:5432/nexus", "postgres://nexus:***@db:5432/nexus"),
            ("postgresql://nexus:p@ss@db/nexus?sslmode=require", "postgresql://nexus:***@db/nexus?sslmode=require"),
            ("postgres://root@127.0.0.1:5432/postgres", "postgres://root@127.0.0.1:5432/postgres"),
            ("postgres://127.0.0.1/nexus", "postgres://127.0.0.1/nexus"),
            ("postgres:///nexus?host=/run/postgresql", "postgres:///nexus?host=/run/postgresql"),
            (
                "postgres://db/nexus?user=n&password=s3cret&sslmode=require",
                "postgres://db/nexus?user=n&password=***&sslmode=require",
            ),
        ];
        for (url, shown) in rows {
            assert_eq!(redact(url), shown, "{url}");
        }
        assert!(is_postgres_url("postgresql://x/y") && is_postgres_url("postgres://x/y"));
        assert!(!is_postgres_url("sqlite://x.db") && !is_postgres_url("mysql://x/y"));
    }
}
