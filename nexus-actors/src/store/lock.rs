//! One serving node per store: the locks `nexus serve` holds for its whole life
//! (`docs/architecture.md`, "One node per store").
//!
//! Nodes do not coordinate yet (which node drives an execution, recovery, wake-ups across
//! nodes), and two nodes on one store corrupt each other's work: one settles a task that the
//! other then re-settles, and tasks admitted on one wait for a runner connected to the other. So
//! a serving node fails closed:
//!
//! - On either backend it holds an exclusive `flock` on `DATA_DIR/nexus.lock` (released by the
//!   kernel when the process dies, however it dies); on SQLite that is the store itself, since
//!   the store is `DATA_DIR/nexus.db`. The file names the holder (its pid and address).
//! - On PostgreSQL it also holds a session advisory lock on one dedicated connection
//!   (`pg_try_advisory_lock` with [`ADVISORY_KEY`], scoped to the database), whose
//!   `application_name` names the node. The connection is checked every [`CHECK_EVERY`]; when
//!   it is lost (the session was terminated, the database restarted, the network failed), the
//!   lock is gone with it, and the node stops serving ([`ServeLock::lost`]) rather than run
//!   unlocked: a restarted node takes the lock again, or refuses if another node took it.
//!
//! `nexus admin` and [`Store::connect`](super::Store::connect) take neither lock: they work
//! beside a running node.

use std::io::{Read, Seek, Write};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgConnection};
use sqlx::{ConnectOptions, Connection};
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;

use super::StoreConfig;
use super::backend::redact;

/// The advisory lock's key pair (`pg_try_advisory_lock(int, int)`): `'nexu'` and 1. The
/// two-key form lives in a key space apart from the one-key form that sqlx's migrations lock
/// with, so the two never collide.
pub const ADVISORY_KEY: (i32, i32) = (0x6e65_7875, 1);
/// How often the lock's connection is checked.
pub const CHECK_EVERY: Duration = Duration::from_secs(1);
/// A check with no answer this long counts as a lost connection.
pub const CHECK_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a node that finds the lock held keeps trying before it refuses: a node killed a
/// moment ago holds it until the database notices its session ended, which takes milliseconds.
pub const TAKEOVER_GRACE: Duration = Duration::from_secs(2);

/// Why a node may not serve this store.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LockError {
    /// Another `nexus serve` holds the data dir.
    #[error(
        "the data dir {} is in use by another nexus ({holder}); one nexus serves a store at a time: stop that one first (kill -TERM its pid, or systemctl stop nexus), or give this one another --data-dir",
        path.display()
    )]
    DataDirInUse {
        /// The data dir.
        path: PathBuf,
        /// What the lock file says about its holder.
        holder: String,
    },
    /// The data dir cannot be created or locked.
    #[error("cannot use the data dir {}: {source}", path.display())]
    DataDir {
        /// The data dir.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// Another node serves the PostgreSQL database.
    #[error(
        "another nexus node serves the database {url} ({holder}); one node serves a database at a time until nodes coordinate (README, \"Store\"): stop that node first (kill -TERM its pid on its host, or systemctl stop nexus), or give this one another database"
    )]
    DatabaseInUse {
        /// The database URL, its password redacted.
        url: String,
        /// What the database says about the session holding the lock.
        holder: String,
    },
    /// The lock's connection could not be opened or the lock not asked for.
    #[error("cannot lock the database {url}: {reason}")]
    Database {
        /// The database URL, its password redacted.
        url: String,
        /// What failed.
        reason: String,
    },
}

/// The locks of a serving node, held until [`ServeLock::release`] or drop.
#[derive(Debug)]
pub struct ServeLock {
    _data_dir: std::fs::File,
    database: Option<DatabaseLock>,
}

#[derive(Debug)]
struct DatabaseLock {
    release: Option<oneshot::Sender<oneshot::Sender<()>>>,
    lost: watch::Receiver<Option<String>>,
    task: JoinHandle<()>,
}

impl Drop for DatabaseLock {
    fn drop(&mut self) {
        // Dropping the connection ends the session, which releases the lock.
        self.task.abort();
    }
}

impl ServeLock {
    /// Takes the data dir's lock, then (when `store` names PostgreSQL) the database's, for a
    /// node that serves at `addr`. Call it before the store is opened, so that a refused node
    /// changes nothing (not even the schema).
    ///
    /// # Errors
    /// [`LockError::DataDirInUse`] or [`LockError::DatabaseInUse`] naming the holder when
    /// another node serves; [`LockError::DataDir`] or [`LockError::Database`] when the lock
    /// cannot be taken at all.
    pub async fn acquire(data_dir: &Path, store: &StoreConfig, addr: SocketAddr) -> Result<ServeLock, LockError> {
        let data_dir_lock = lock_data_dir(data_dir, addr)?;
        let database = match &store.database_url {
            Some(url) => Some(lock_database(url, store.acquire_timeout(), addr).await?),
            None => None,
        };
        Ok(ServeLock { _data_dir: data_dir_lock, database })
    }

    /// Resolves when the database lock's connection is lost, with why; never on SQLite.
    pub fn lost(&self) -> impl Future<Output = String> + Send + 'static {
        let lost = self.database.as_ref().map(|lock| lock.lost.clone());
        async move {
            let Some(mut lost) = lost else { return std::future::pending().await };
            let reason = match lost.wait_for(Option::is_some).await {
                Ok(reason) => reason.clone(),
                // Released on purpose: nothing was lost.
                Err(_) => None,
            };
            match reason {
                Some(reason) => reason,
                None => std::future::pending().await,
            }
        }
    }

    /// Releases the database lock and waits until the database has (so that a node started
    /// next can take it at once); the data dir's lock goes when this value drops.
    pub async fn release(&mut self) {
        let Some(lock) = &mut self.database else { return };
        let Some(release) = lock.release.take() else { return };
        let (done_tx, done_rx) = oneshot::channel();
        if release.send(done_tx).is_ok() {
            let _ = done_rx.await;
        }
    }
}

/// Takes `DIR/nexus.lock` and writes the holder into it.
fn lock_data_dir(dir: &Path, addr: SocketAddr) -> Result<std::fs::File, LockError> {
    let fail = |source| LockError::DataDir { path: dir.to_owned(), source };
    std::fs::create_dir_all(dir).map_err(fail)?;
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .read(true)
        .write(true)
        .open(dir.join("nexus.lock"))
        .map_err(fail)?;
    match file.try_lock() {
        Ok(()) => {}
        Err(std::fs::TryLockError::WouldBlock) => {
            let mut holder = String::new();
            let _ = file.read_to_string(&mut holder);
            let holder = holder.trim();
            let holder = if holder.is_empty() { "its holder wrote no pid".to_owned() } else { holder.to_owned() };
            return Err(LockError::DataDirInUse { path: dir.to_owned(), holder });
        }
        Err(std::fs::TryLockError::Error(e)) => return Err(fail(e)),
    }
    // Informational only: the flock is the lock.
    let holder = format!("pid {}, listening on {addr}", std::process::id());
    let written = file.set_len(0).and_then(|()| file.rewind()).and_then(|()| writeln!(file, "{holder}"));
    if let Err(error) = written {
        tracing::debug!(%error, "cannot write the holder into nexus.lock");
    }
    Ok(file)
}

async fn lock_database(url: &str, connect_timeout: Duration, addr: SocketAddr) -> Result<DatabaseLock, LockError> {
    let shown = redact(url);
    let fail = |reason: String| LockError::Database { url: shown.clone(), reason };
    // PostgreSQL keeps 63 bytes of it; this stays well under.
    let name = format!("nexus serve pid {} on {addr}", std::process::id());
    let options = PgConnectOptions::from_str(url).map_err(|e| fail(e.to_string()))?.application_name(&name);
    let mut connection = tokio::time::timeout(connect_timeout, options.connect())
        .await
        .map_err(|_| fail(format!("no connection within {} ms", connect_timeout.as_millis())))?
        .map_err(|e| fail(e.to_string()))?;
    let deadline = tokio::time::Instant::now() + TAKEOVER_GRACE;
    loop {
        let taken: bool = sqlx::query_scalar("SELECT pg_try_advisory_lock($1, $2)")
            .bind(ADVISORY_KEY.0)
            .bind(ADVISORY_KEY.1)
            .fetch_one(&mut connection)
            .await
            .map_err(|e| fail(e.to_string()))?;
        if taken {
            break;
        }
        if tokio::time::Instant::now() >= deadline {
            let holder = holder(&mut connection).await;
            let _ = connection.close().await;
            return Err(LockError::DatabaseInUse { url: shown, holder });
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (release_tx, release_rx) = oneshot::channel();
    let (lost_tx, lost_rx) = watch::channel(None);
    let task = tokio::spawn(tracing::Instrument::instrument(
        hold(connection, release_rx, lost_tx),
        tracing::info_span!("store_lock"),
    ));
    Ok(DatabaseLock { release: Some(release_tx), lost: lost_rx, task })
}

/// A lock holder's row: backend pid, `application_name`, client address, session start.
type HolderRow = (i32, Option<String>, Option<String>, Option<String>);

/// The session holding the lock, as `pg_stat_activity` shows it (a role without
/// `pg_read_all_stats` sees less of another role's session).
async fn holder(connection: &mut PgConnection) -> String {
    let row: Result<Option<HolderRow>, _> = sqlx::query_as(
        "SELECT a.pid, a.application_name, host(a.client_addr), to_char(a.backend_start, 'YYYY-MM-DD HH24:MI:SS TZ') \
         FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid \
         WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 2 \
           AND l.classid::bigint = $1 AND l.objid::bigint = $2 \
           AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database()) \
         LIMIT 1",
    )
    .bind(i64::from(ADVISORY_KEY.0))
    .bind(i64::from(ADVISORY_KEY.1))
    .fetch_optional(connection)
    .await;
    match row {
        Ok(Some((pid, name, client, since))) => {
            let mut text = format!("the session holding its lock: backend pid {pid}");
            if let Some(name) = name.filter(|name| !name.is_empty()) {
                text.push_str(&format!(", application_name \"{name}\""));
            }
            if let Some(client) = client {
                text.push_str(&format!(", client {client}"));
            }
            if let Some(since) = since {
                text.push_str(&format!(", connected since {since}"));
            }
            text
        }
        Ok(None) => "its lock session ended a moment ago; try again".to_owned(),
        Err(error) => format!("its lock session cannot be read: {error}"),
    }
}

/// Holds the lock's connection: checks it every [`CHECK_EVERY`], says when it is lost, and
/// unlocks when asked.
async fn hold(
    mut connection: PgConnection,
    mut release: oneshot::Receiver<oneshot::Sender<()>>,
    lost: watch::Sender<Option<String>>,
) {
    let mut checks = tokio::time::interval(CHECK_EVERY);
    checks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            asked = &mut release => {
                let unlock = sqlx::query("SELECT pg_advisory_unlock($1, $2)")
                    .bind(ADVISORY_KEY.0)
                    .bind(ADVISORY_KEY.1)
                    .execute(&mut connection);
                if let Ok(Err(error)) = tokio::time::timeout(CHECK_TIMEOUT, unlock).await {
                    tracing::debug!(%error, "cannot unlock the database; closing its session releases it");
                }
                let _ = tokio::time::timeout(CHECK_TIMEOUT, connection.close()).await;
                if let Ok(done) = asked {
                    let _ = done.send(());
                }
                return;
            }
            _ = checks.tick() => {
                let reason = match tokio::time::timeout(CHECK_TIMEOUT, connection.ping()).await {
                    Ok(Ok(())) => continue,
                    Ok(Err(error)) => error.to_string(),
                    Err(_) => format!("no answer within {} ms", CHECK_TIMEOUT.as_millis()),
                };
                tracing::error!(reason, "lost the database lock's connection; this node stops serving");
                let _ = lost.send(Some(reason));
                return;
            }
        }
    }
}
